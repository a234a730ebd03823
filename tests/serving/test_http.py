"""The served routes' contract: auth, bad bodies, failed runs' statuses, the loopback rule,
and serving without a trace store."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from langgraph.graph import START, MessagesState, StateGraph

import agentrl_sdk as sdk
from tests.conftest import ScriptedEngine
from tests.serving.conftest import ensure_experiment, two_call_graph

FAST = sdk.RolloutConfig(sampling=sdk.SamplingParams(max_tokens=8), timeout_s=0.5)
BODY = {"input": {"messages": [{"role": "user", "content": "hi"}]}}


def _graph(node):
    graph = StateGraph(MessagesState)
    graph.add_node("agent", node)
    graph.add_edge(START, "agent")
    return graph.compile()


async def _failing(state):
    raise RuntimeError("secret detail")


async def _slow(state):
    await asyncio.sleep(5)
    return {}


async def _requests(graph, engine, tokenizer, config, calls):
    async with sdk.GraphServer(graph, engine, tokenizer=tokenizer, config=config,
                               rollout=FAST) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            replies = [await client.request(method, path, **kw) for method, path, kw in calls]
            health = (await client.get("/health")).json()
    return replies, health


def test_auth_and_bad_bodies(qwen_tokenizer):
    engine = ScriptedEngine(qwen_tokenizer, ["Hello there.", "Again."])
    config = sdk.ServeConfig(port=0, tracking_uri=None, api_key="k3y")
    key = {"headers": {"Authorization": "Bearer k3y"}}
    replies, health = asyncio.run(_requests(two_call_graph(), engine, qwen_tokenizer, config, [
        ("POST", "/invoke", {"json": BODY}),
        ("POST", "/invoke", {"json": BODY, "headers": {"Authorization": "Bearer nope"}}),
        ("POST", "/invoke", {"content": b"{not json", **key}),
        ("POST", "/invoke", {"json": {"messages": []}, **key}),
        ("POST", "/invoke", {"json": {**BODY, "tags": {"a": 1}}, **key}),
        ("POST", "/invoke", {"json": {**BODY, "tags": {"mlflow.user": "x"}}, **key}),
        ("POST", "/invoke", {"content": b"x" * (3 * 1024 * 1024), **key}),
        ("POST", "/invoke", {"json": BODY, **key}),
    ]))
    assert [r.status_code for r in replies] == [401, 401, 400, 422, 422, 422, 413, 200]
    assert [r.json()["error"]["type"] for r in replies[:3]] == [
        "unauthorized", "unauthorized", "invalid_json"]
    served = replies[-1].json()
    assert served["trace_id"] is None  # no store: served, not traced
    assert [m["content"] for m in served["output"]["messages"]] == [
        "hi", "Hello there.", "Say it again, shorter.", "Again."]
    assert health == {"status": "ok", "requests": {"ok": 1}}


def test_failed_runs_answer_their_status_not_their_error(qwen_tokenizer, store):
    ensure_experiment(store, "failures")
    engine = ScriptedEngine(qwen_tokenizer, [])
    config = sdk.ServeConfig(port=0, tracking_uri=store, experiment="failures")
    failed, _ = asyncio.run(_requests(_graph(_failing), engine, qwen_tokenizer, config,
                                      [("POST", "/invoke", {"json": BODY})]))
    slow, health = asyncio.run(_requests(_graph(_slow), engine, qwen_tokenizer, config,
                                         [("POST", "/invoke", {"json": BODY})]))
    assert failed[0].status_code == 500 and slow[0].status_code == 504
    assert failed[0].json()["status"] == "graph_error" and slow[0].json()["status"] == "timeout"
    assert "secret detail" not in failed[0].text and failed[0].json()["output"] is None
    assert health["requests"] == {"timeout": 1}
    records = {r.trace_id: r for r in sdk.traces(store, experiment="failures").records}
    assert records[failed[0].json()["trace_id"]].tags["status"] == "graph_error"
    assert records[slow[0].json()["trace_id"]].tags["status"] == "timeout"


def test_a_reachable_host_needs_a_key():
    with pytest.raises(ValueError, match="not a loopback address and no api_key"):
        sdk.ServeConfig(host="0.0.0.0")
    assert sdk.ServeConfig(host="0.0.0.0", api_key="k").host == "0.0.0.0"
    assert sdk.ServeConfig(host="0.0.0.0", allow_unauthenticated_remote=True).api_key is None


def test_a_request_needs_a_time_limit(qwen_tokenizer):
    with pytest.raises(ValueError, match="timeout_s must be set"):
        sdk.GraphServer(two_call_graph(), ScriptedEngine(qwen_tokenizer, []),
                        tokenizer=qwen_tokenizer, rollout=sdk.RolloutConfig(timeout_s=None))
