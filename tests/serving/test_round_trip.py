"""A graph served on the real TorchEngine: each request answers its output and trace id, and
the trace `sdk.traces` reads back holds exactly the ids and logprobs the engine returned."""

from __future__ import annotations

import asyncio

import httpx
import mlflow

import agentrl_sdk as sdk
from agentrl_sdk.identity import tokenizer_identity
from agentrl_sdk.tracing import load_trace_view
from tests.serving.conftest import ROLLOUT, ensure_experiment, two_call_graph

QUESTIONS = ["What is 2 + 3?", "Name a colour."]


async def _serve_and_ask(engine, tokenizer, store, model_dir, bodies):
    config = sdk.ServeConfig(port=0, tracking_uri=store, experiment="served",
                             tags={"deployment": "test"})
    server = sdk.GraphServer(two_call_graph(), engine, tokenizer=tokenizer, config=config,
                             rollout=ROLLOUT, model_name=model_dir)
    async with server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            replies = [await client.post("/invoke", json=body) for body in bodies]
            health = (await client.get("/health")).json()
    return replies, health, server


def test_a_served_requests_trace_holds_the_ids_and_logprobs_the_engine_returned(
    engine, tokenizer, store, model_dir
):
    ensure_experiment(store, "served")
    bodies = [{"input": {"messages": [{"role": "user", "content": q}]},
               "tags": {"customer": f"c{i}"}} for i, q in enumerate(QUESTIONS)]
    replies, health, server = asyncio.run(
        _serve_and_ask(engine, tokenizer, store, model_dir, bodies))

    assert [r.status_code for r in replies] == [200, 200]
    answers = [r.json() for r in replies]
    assert [a["status"] for a in answers] == ["ok", "ok"]
    assert health["requests"] == {"ok": 2}
    assert server.traces.counts == {"traces_written": 2, "traces_pending": 0,
                                    "traces_dropped": 0, "traces_lost": 0,
                                    "trace_write_errors": 0}
    assert len(engine.answers) == 4  # two calls per request

    selection = sdk.traces(store, experiment="served", tags={"phase": "serve"},
                           reward=lambda record: 1.0)
    assert len(selection) == 2 and not selection.left_out
    by_id = {r.trace_id: r for r in selection.records}
    assert set(by_id) == {a["trace_id"] for a in answers}
    for body, answer in zip(bodies, answers, strict=True):
        record = by_id[answer["trace_id"]]
        assert record.inputs == body["input"]
        assert record.outputs == answer["output"]
        texts = [m["content"] for m in answer["output"]["messages"]]
        assert texts[0] == body["input"]["messages"][0]["content"]
        assert texts[2] == "Say it again, shorter."
        assert record.tokenizer == tokenizer_identity(tokenizer)
        assert record.tags["model"] == model_dir
        assert record.tags["request_id"] == answer["request_id"]
        assert record.tags["customer"] == body["tags"]["customer"]
        assert record.tags["deployment"] == "test" and record.tags["status"] == "ok"
        assert "step" not in record.tags
        assert record.policy_versions == [0]
        # The response mask: 1 on both sampled replies, 0 on the follow-up question.
        [segment] = record.segments
        first, second = record.calls
        assert segment.response_mask == ([1] * len(first.response_ids)
                                         + [0] * (len(second.prompt_ids)
                                                  - len(first.prompt_ids)
                                                  - len(first.response_ids))
                                         + [1] * len(second.response_ids))

    view = load_trace_view(store, answers[0]["trace_id"])  # what `agentrl inspect` shows
    assert view.title == f"row {answers[0]['request_id']} · sample 0"

    samples = selection.samples(tokenizer, per_call=True)
    answered = sorted((p, r.token_ids, r.logprobs, r.versions) for p, r in engine.answers)
    traced = sorted((s.prompt_ids, s.response_ids, s.old_logprobs, s.response_versions)
                    for s in samples)
    assert traced == answered  # every request, id for id, logprob for logprob
    assert [r["messages"] for r in selection.rows()] == [
        b["input"]["messages"] for b in reversed(bodies)]  # newest first

    # The MLflow UI shows the request and lets people attach feedback: it becomes the reward.
    mlflow.set_tracking_uri(store)
    for answer, value in zip(answers, [True, False], strict=True):
        mlflow.log_feedback(trace_id=answer["trace_id"], name="helpful", value=value)
    rated = sdk.traces(store, experiment="served", reward="helpful")
    assert sorted(r.reward for r in rated.records) == [0.0, 1.0]
    assert len(rated.samples(tokenizer)) == 2
