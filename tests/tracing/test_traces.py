"""Rollout traces: event capture under 32 concurrent rollouts, span nesting, attributes, search."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys

import mlflow
import pytest
from typer.testing import CliRunner

import agentrl_sdk as sdk
from agentrl_sdk.cli import app
from agentrl_sdk.tracing import (
    RolloutCredit,
    TrainingRun,
    TraceView,
    build_trace,
    load_trace_view,
    render_trace,
    rollout_credit,
    search_rollout_traces,
    select_rollouts,
    trace_html,
)
from agentrl_sdk.types import GenerateResult, RewardComponent, Sample, Trajectory
from examples.calculator.agent import build_graph, make_rows

ROWS = make_rows(4, seed=7)


class InterleavingEngine:
    """Per rollout: a calculator call naming the rollout, a malformed call, a call the tool
    rejects, then the answer; every answer after a random delay, so 32 rollouts interleave."""

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        await asyncio.sleep(self.rng.random() * 0.004)
        rollout, turn = request_id.rsplit("-", 1)
        uid = _uid(rollout)
        text = [
            f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{uid}+0"}}}}\n</tool_call>',
            "<tool_call>{oops</tool_call>",
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call>',
            f"The answer is {uid}.",
        ][int(turn)]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.im_end]
        return GenerateResult(token_ids=ids, logprobs=[-0.1 - 0.001 * i for i in range(len(ids))],
                              finish_reason="stop", policy_version=int(turn) // 2)


def _uid(rollout_id: str) -> int:
    row, sample = rollout_id.rsplit(":", 1)
    return 1000 * (int(row.rsplit("-", 1)[1]) + 1) + int(sample)


@pytest.fixture(scope="module")
def rollouts(qwen_tokenizer):
    """32 concurrent rollouts (4 rows x 8 samples) with events recorded, scored."""
    trajectories = asyncio.run(sdk.arollout_batch(
        build_graph(), ROWS, InterleavingEngine(qwen_tokenizer), tokenizer=qwen_tokenizer, n=8,
        config=sdk.RolloutConfig(concurrency=32), record_events=True,
    ))
    for t in trajectories:
        t.components = [RewardComponent(name="answer", value=t.sample_index % 2),
                        RewardComponent(name="format", value=0.0)]
        t.reward = sum(t.rewards.values())
    return trajectories


def _tree(spans):
    by_id = {s.span_id: s for s in spans}
    return by_id, {s.span_id: by_id.get(s.parent_id) for s in spans}


def test_32_concurrent_rollouts_each_trace_holds_only_its_own_spans(rollouts, qwen_tokenizer):
    assert len(rollouts) == 32 and all(t.status == "ok" for t in rollouts)
    for traj in rollouts:
        uid = _uid(f"{traj.row_id}:{traj.sample_index}")
        _, spans = build_trace(traj, experiment_id="0", step=0, tokenizer=qwen_tokenizer)
        _, parent = _tree(spans)
        assert len({s.trace_id for s in spans}) == 1
        kinds = [s.attributes.get("agentrl.kind") for s in spans[1:]]
        assert kinds.count("node") == 7 and kinds.count("llm") == 4 and kinds.count("engine") == 4
        assert kinds.count("tool") == 3  # the good call, the malformed one, the one that raised
        for span in spans[1:]:
            kind = span.attributes["agentrl.kind"]
            up = parent[span.span_id]
            assert up is not None and up.start_time_ns <= span.start_time_ns
            assert span.end_time_ns <= up.end_time_ns
            if kind == "node":
                assert up is spans[0] and span.name in ("solver", "tools")
            if kind == "llm":
                assert up.name == "solver"
                assert span.attributes["agentrl.request_id"].startswith(
                    f"{traj.row_id}:{traj.sample_index}-")
            if kind == "engine":
                assert up.attributes["agentrl.kind"] == "llm"
                assert up.attributes["agentrl.request_id"] == span.attributes["agentrl.request_id"]
            if kind == "tool":
                assert up.name == "tools"
        tools = [s for s in spans if s.attributes.get("agentrl.kind") == "tool"]
        # The one good call computed this rollout's own number: no other rollout's tool run.
        assert tools[0].inputs == {"expression": f"{uid}+0"}
        assert tools[0].outputs["content"] == str(uid) and tools[0].status.status_code == "OK"
        assert "malformed" in tools[1].name and tools[1].status.status_code == "ERROR"
        assert tools[2].status.status_code == "ERROR"
        assert "ZeroDivisionError" in tools[2].status.description


def test_llm_span_attributes_equal_the_trajectory(rollouts, qwen_tokenizer):
    traj = rollouts[5]
    credit = RolloutCredit(advantage=0.75, loss_share=0.125)
    info, spans = build_trace(traj, experiment_id="0", step=3, run_id="r1", credit=credit,
                              tokenizer=qwen_tokenizer)
    root = spans[0]
    assert root.attributes["agentrl.reward"] == traj.reward
    assert root.attributes["agentrl.rewards"] == traj.rewards == {"answer": 1.0, "format": 0.0}
    assert root.attributes["agentrl.advantage"] == 0.75
    assert root.attributes["agentrl.loss_share"] == 0.125
    (seg_view,) = root.attributes["agentrl.segments"]
    (seg,) = traj.segments
    for key in ("prompt_ids", "response_ids", "response_mask", "response_logprobs",
                "response_versions"):
        assert seg_view[key] == getattr(seg, key), key
    llms = [s for s in spans if s.attributes.get("agentrl.kind") == "llm"]
    assert len(llms) == len(traj.calls)
    for span, call in zip(llms, traj.calls, strict=True):
        a = span.attributes
        assert a["agentrl.prompt_ids"] == call.prompt_ids
        assert a["agentrl.response_ids"] == call.response_ids
        assert a["agentrl.response_logprobs"] == call.response_logprobs
        assert a["agentrl.policy_version"] == call.policy_version
        offset = a["agentrl.segment_offset"]
        assert seg.response_ids[offset : offset + len(call.response_ids)] == call.response_ids
        assert a["agentrl.response_mask"] == [1] * len(call.response_ids)
        assert span.outputs["response_text"] == qwen_tokenizer.decode(call.response_ids)
    assert info.tags | {"step": "3", "status": "ok", "run_id": "r1", "policy_versions": "0,1",
                        "advantage": "0.75"} == info.tags


def test_sampling_modes_and_loss_shares():
    trajs = [Trajectory(row_id=r, sample_index=i, status="ok" if i else "timeout")
             for r in ("a", "b", "c") for i in range(2)]
    assert [(t.row_id, t.sample_index) for t in select_rollouts(trajs, "first_k", 2)] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert len(select_rollouts(trajs, "failures")) == 3
    assert len(select_rollouts(trajs, "all")) == 6 and select_rollouts(trajs, "off") == []

    def sample(row, i, trained, weight=1.0):
        n = 4
        return Sample(row_id=row, sample_index=i, prompt_ids=[1], response_ids=[2] * n,
                      response_mask=[1] * trained + [0] * (n - trained), old_logprobs=[0.0] * n,
                      token_advantages=[float(i)] * n, weight=weight)

    samples = [sample("a", 0, 1), sample("a", 1, 3, 0.5), sample("a", 1, 1, 0.5)]
    seq = rollout_credit(samples, "seq-mean-token-mean")
    assert seq[("a", 0)].loss_share == pytest.approx(0.5) and seq[("a", 1)].advantage == 1.0
    tok = rollout_credit(samples, "token-mean")
    assert tok[("a", 0)].loss_share == pytest.approx(1 / 3)
    assert sum(c.loss_share for c in tok.values()) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def store(rollouts, qwen_tokenizer, tmp_path_factory):
    """A finished run in a sqlite store: step 0 traces all 32 rollouts, step 1 rows 1-2 only."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    run = TrainingRun(uri, "traces-test", run_name="t")
    credit = {(t.row_id, t.sample_index): RolloutCredit(t.reward - 0.5, 1 / 32) for t in rollouts}
    ids0 = run.log_traces(0, rollouts, sampling="all", credit=credit, tokenizer=qwen_tokenizer)
    failed = rollouts[0].model_copy(update={"status": "timeout", "error": "rollout exceeded 1s"})
    ids1 = run.log_traces(1, [*rollouts[8:], failed], sampling="first_k", k=2, credit=credit,
                          tokenizer=qwen_tokenizer)
    ids1 += run.log_traces(1, [failed], sampling="failures", tokenizer=qwen_tokenizer)
    run.end()
    return uri, run, ids0, ids1


def test_search_by_step_status_row_and_reward(store, rollouts):
    uri, run, ids0, ids1 = store
    assert len(ids0) == 32 and len(ids1) == 17
    found = search_rollout_traces(uri, run_id=run.run_id, step=0, limit=100)
    assert sorted(i.trace_id for i in found) == sorted(ids0)
    assert {i.tags["row_id"] for i in search_rollout_traces(uri, run_id=run.run_id, step=1,
                                                             limit=100)} == {
        ROWS[1]["id"], ROWS[2]["id"], ROWS[0]["id"]}
    (failed,) = search_rollout_traces(uri, experiment="traces-test", status="timeout")
    assert failed.tags["step"] == "1" and failed.state.value == "ERROR"
    client = mlflow.MlflowClient(uri)
    rewarded = client.search_traces(locations=[run.experiment_id],
                                    filter_string="tags.step = '0' AND tags.reward = '1'")
    assert len(rewarded) == 16 and all(int(t.info.tags["sample_index"]) % 2 for t in rewarded)
    row = search_rollout_traces(uri, run_id=run.run_id, step=0, row_id=ROWS[3]["id"])
    assert sorted(int(i.tags["sample_index"]) for i in row) == list(range(8))
    assert len(search_rollout_traces(uri, run_id=run.run_id, step=0, kind="rollout",
                                     limit=100)) == 32  # fmt: skip
    assert search_rollout_traces(uri, run_id=run.run_id, kind="tree") == []  # chains only
    with pytest.raises(ValueError, match=r"kind is one of \('rollout', 'tree'\) or None"):
        search_rollout_traces(uri, run_id=run.run_id, kind="leaf")
    # Filter values are quoted, not pasted: a quote in one matches nothing instead of breaking
    # the filter; one holding both quotes cannot be said in MLflow's filter language.
    assert search_rollout_traces(uri, run_id=run.run_id, row_id="it's") == []
    with pytest.raises(ValueError, match="holds both"):
        search_rollout_traces(uri, run_id=run.run_id, row_id="it's \"x\"")
    # Traces are linked to the training run.
    assert len(client.search_traces(locations=[run.experiment_id], run_id=run.run_id,
                                    max_results=100)) == 49


def test_trace_read_back_equals_the_trajectory(store, rollouts):
    uri, _, ids0, _ = store
    view = load_trace_view(uri, ids0[9])
    traj = rollouts[9]
    assert (view.root["row_id"], view.root["sample_index"]) == (traj.row_id, traj.sample_index)
    assert view.root["rewards"] == traj.rewards != {}
    assert view.segments[0]["response_mask"] == traj.segments[0].response_mask
    assert view.segments[0]["response_ids"] == traj.segments[0].response_ids
    assert [line.depth for line in view.spans][:4] == [0, 1, 2, 3]  # rollout/solver/llm/engine
    assert sum(line.error is not None for line in view.spans) == 2


def test_terminal_and_html_views(store):
    uri, _, ids0, _ = store
    view = load_trace_view(uri, ids0[1])
    from rich.console import Console

    console = Console(record=True, width=140)
    console.print(render_trace(view))
    text = console.export_text()
    assert "advantage: 0.5" in text and "calculator" in text and "malformed call" in text
    assert "ZeroDivisionError" in text or "division" in text
    page = trace_html(view)
    assert "<script" not in page and "http" not in page.split("<body>")[1]
    assert "gen-pos" in page and "class='obs'" in page and "The answer is 1001." in page


def test_cli_inspect_lists_and_shows_traces(store, tmp_path):
    uri, run, ids0, _ = store
    runner = CliRunner()
    listed = runner.invoke(app, ["inspect", "--uri", uri, "--run", run.run_id, "--step", "0",
                                 "--limit", "100"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert len(re.findall(r"tr-[0-9a-f]{32}", listed.output)) == 32
    out = tmp_path / "trace.html"
    shown = runner.invoke(app, ["inspect", ids0[0], "--uri", uri, "--html", str(out)],
                          env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "segment 0" in shown.output and out.read_text().startswith("<!DOCTYPE html>")
    view = TraceView.from_trace(mlflow.MlflowClient(uri).get_trace(ids0[0]))
    assert json.dumps(view.summary())  # JSON-friendly all the way down


_FIRST_MLFLOW_IMPORT = """
import os, sys
seen = []
class Spy:  # records the telemetry switch when mlflow is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" and not seen:
            seen.append(os.environ.get("MLFLOW_DISABLE_TELEMETRY"))
sys.meta_path.insert(0, Spy())
from typer.testing import CliRunner
from agentrl_sdk.cli import app
result = CliRunner().invoke(app, ["inspect", "--uri", sys.argv[1], "--limit", "1"])
assert result.exit_code == 0, result.output
print(seen)
"""


def test_cli_inspect_imports_mlflow_with_telemetry_off(store):
    uri = store[0]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    env["DO_NOT_TRACK"] = "true"  # nothing is sent even if the switch were missing
    out = subprocess.run([sys.executable, "-c", _FIRST_MLFLOW_IMPORT, uri], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "['true']"
