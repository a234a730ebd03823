"""A tracking store that stalls or dies while serving costs no request: every request is
answered while the store is stalled (its traces wait and are written once it is back, past
``max_pending_traces`` they are dropped) or gone (its traces are lost), and each trace not
written is counted, never dropped silently."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.tracing import MlflowServer
from tests.serving.conftest import ROLLOUT, ensure_experiment, two_call_graph

pytestmark = pytest.mark.slow

BODY = {"input": {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}}


async def _until(client: httpx.AsyncClient, key: str, value: int, timeout_s: float = 60.0):
    """``/health`` once its ``key`` is ``value``."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = (await client.get("/health")).json()
        if health[key] == value or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.1)


async def _serve_through_an_outage(engine, tokenizer, mlflow_server):
    config = sdk.ServeConfig(port=0, tracking_uri=mlflow_server.url, experiment="served",
                             max_pending_traces=3, close_timeout_s=10)
    server = sdk.GraphServer(two_call_graph(), engine, tokenizer=tokenizer, config=config,
                             rollout=ROLLOUT)
    group = mlflow_server._process.pid
    answers, seen = [], {}
    async with server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

            async def ask() -> None:
                reply = await client.post("/invoke", json=BODY)
                answers.append((reply.status_code, reply.json()))

            await ask()
            seen["up"] = await _until(client, "traces_written", 1)
            os.killpg(group, signal.SIGSTOP)  # the store stalls: it accepts, never answers
            try:
                for _ in range(4):
                    await ask()
                seen["stalled"] = (await client.get("/health")).json()
            finally:
                os.killpg(group, signal.SIGCONT)
            seen["back"] = await _until(client, "traces_written", 4)
            mlflow_server.stop()  # the store is gone
            for _ in range(2):
                await ask()
            seen["gone"] = await _until(client, "traces_lost", 2)
    seen["closed"] = server.traces.counts
    return answers, seen


def test_mlflow_stalled_or_down_while_serving_loses_no_request(engine, tokenizer, store):
    ensure_experiment(store, "served")
    with MlflowServer(store) as mlflow_server:
        answers, seen = asyncio.run(_serve_through_an_outage(engine, tokenizer, mlflow_server))

    assert [code for code, _ in answers] == [200] * 7
    assert all(a["status"] == "ok" and a["output"]["messages"] for _, a in answers)
    assert seen["up"]["traces_written"] == 1
    # Stalled: the three traces that fit wait; the fourth request's trace is dropped.
    assert {k: seen["stalled"][k] for k in ("traces_written", "traces_pending",
                                            "traces_dropped", "traces_lost")} == {
        "traces_written": 1, "traces_pending": 3, "traces_dropped": 1, "traces_lost": 0}
    traced = [a["trace_id"] for _, a in answers]
    assert traced[4] is None and all(traced[:4]) and all(traced[5:])
    assert seen["back"]["traces_written"] == 4 and seen["back"]["traces_pending"] == 0
    # Gone: both traces are lost, counted, and the requests were served all the same.
    assert seen["closed"]["traces_written"] == 4
    assert seen["closed"]["traces_lost"] == 2 and seen["closed"]["traces_dropped"] == 1
    assert seen["closed"]["trace_write_errors"] >= 1 and seen["closed"]["traces_pending"] == 0
    assert seen["gone"]["requests"] == {"ok": 7}

    written = sdk.traces(store, experiment="served")
    assert sorted(r.trace_id for r in written.records) == sorted(traced[:4])
