"""Replaying traced prompts: each trace's input becomes a dataset row that rolls out to the
same prompt ids the served request had."""

from __future__ import annotations

import asyncio
import copy

import mlflow

import agentrl_sdk as sdk
from agentrl_sdk.data import load_rows
from examples.calculator.agent import build_graph, make_rows
from tests.conftest import ScriptedEngine
from tests.production.conftest import ensure_experiment, serve


def _other_tool_trace(uri: str, inputs: dict) -> None:
    """A trace written by something else than this SDK (no token ledger)."""
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(uri, "served"))
    with mlflow.start_span("agent") as span:
        span.set_inputs(inputs)
    mlflow.flush_trace_async_logging()


def test_rows_are_the_traced_inputs_and_roll_out_to_the_traced_prompts(served, qwen_tokenizer):
    selection = sdk.traces(served.uri, experiment="served")
    rows = selection.rows()
    assert len(rows) == 4 and "not_replayable" not in selection.left_out
    by_trace = {row["extra_info"]["trace"]["trace_id"]: row for row in rows}
    good, problems = load_rows(rows, on_bad_row="raise")
    assert len(good) == 4 and problems == []
    for index, trace_id in enumerate(served.trace_ids):
        row = by_trace[trace_id]
        assert row["messages"] == served.rows[index]["messages"]
        assert row["id"] == f"trace-{trace_id}"
        engine = ScriptedEngine(qwen_tokenizer, ["The answer is 1."])
        asyncio.run(sdk.arollout(build_graph(), row, engine, tokenizer=qwen_tokenizer))
        assert engine.prompts[0] == served.engine.prompts[2 * index]


def test_long_inputs_are_replayed_whole(store, qwen_tokenizer):
    row = copy.deepcopy(make_rows(1, seed=11)[0])
    row["messages"][-1]["content"] += " Context: " + "lorem ipsum " * 400
    served = serve(ScriptedEngine, qwen_tokenizer, store, "served", [row])
    [replayed] = sdk.traces(store, experiment="served").rows()
    assert replayed["messages"] == row["messages"]
    assert len(replayed["messages"][-1]["content"]) > 4000
    assert served.trace_ids


def test_langchain_messages_become_chat_rows_and_other_inputs_are_counted(store):
    _other_tool_trace(store, {"messages": [
        {"type": "system", "content": "Be brief."}, {"type": "human", "content": "hi"},
        {"type": "ai", "content": "", "tool_calls": [{"name": "f", "args": {}, "id": "1"}]},
        {"type": "tool", "content": "3", "tool_call_id": "1"}]})
    _other_tool_trace(store, {"question": "What is 2+2?"})
    selection = sdk.traces(store, experiment="served")
    rows = selection.rows()
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant", "tool"]
    assert rows[0]["messages"][2]["tool_calls"] == [{"name": "f", "args": {}, "id": "1"}]
    assert rows[0]["messages"][3]["tool_call_id"] == "1"
    assert len(rows) == 1 and len(selection.left_out["not_replayable"]) == 1
    assert load_rows(rows, on_bad_row="raise")[0] == rows


def test_a_row_function_builds_rows_from_any_input(store):
    _other_tool_trace(store, {"question": "What is 2+2?"})
    mlflow.set_tracking_uri(store)
    selection = sdk.traces(store, experiment="served")
    mlflow.log_expectation(trace_id=selection.records[0].trace_id, name="answer", value="4")
    selection = sdk.traces(store, experiment="served")

    def row_fn(record):
        return {"messages": [{"role": "user", "content": record.inputs["question"]}],
                "answer": record.expectations["answer"]}

    assert selection.rows(row_fn) == [{"messages": [{"role": "user", "content": "What is 2+2?"}],
                                       "answer": "4"}]
    assert "not_replayable" not in selection.left_out


def test_trace_content_is_data_never_executed(served, tmp_path):
    marker = tmp_path / "executed"
    code = f"__import__('os').system('touch {marker}')"
    _other_tool_trace(served.uri, {"messages": [{"role": "user", "content": code}],
                                   "hook": {"py/object": "os.system", "args": [f"touch {marker}"]}})
    mlflow.set_tracking_uri(served.uri)
    selection = sdk.traces(served.uri, experiment="served")
    mlflow.log_feedback(trace_id=selection.records[0].trace_id, name="correct", value=True)
    selection = sdk.traces(served.uri, experiment="served", reward="correct")
    [row] = selection.rows()
    assert row["messages"][0]["content"] == code
    assert row["hook"] == {"py/object": "os.system", "args": [f"touch {marker}"]}
    assert not marker.exists()
