"""A rollout an OpenAI client drives through the standalone gateway and closes is traced: the
trace holds exactly the ids and logprobs the real engine returned."""

from __future__ import annotations

import asyncio

import httpx
from openai import AsyncOpenAI

import agentrl_sdk as sdk
from agentrl_sdk.gateway import Gateway, GatewayConfig
from agentrl_sdk.serving import ServedTraces
from tests.serving.conftest import ROLLOUT, ensure_experiment


async def _drive(engine, tokenizer, traces):
    config = GatewayConfig(port=0, open_on_first_call=True)
    async with Gateway(engine, tokenizer, config=config, rollout=ROLLOUT,
                       on_client_close=traces.record_rollout) as gateway:
        client = AsyncOpenAI(base_url=gateway.rollout_url("r1"), api_key=gateway.api_key,
                             max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Hi?"}]
        first = await client.chat.completions.create(model="agentrl", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Shorter."}]
        await client.chat.completions.create(model="agentrl", messages=messages)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            closed = await http.delete("/rollouts/r1",
                                       headers={"Authorization": f"Bearer {gateway.api_key}"})
    return closed


def test_a_closed_gateway_rollout_is_traced_id_for_id(engine, tokenizer, store):
    experiment_id = ensure_experiment(store, "gateway")
    traces = ServedTraces(store, experiment_id, tokenizer)
    closed = asyncio.run(_drive(engine, tokenizer, traces))
    assert closed.status_code == 200
    assert traces.close() == {"traces_written": 1, "traces_pending": 0, "traces_dropped": 0,
                              "traces_lost": 0, "trace_write_errors": 0}

    [record] = sdk.traces(store, experiment="gateway", reward=lambda r: 1.0).records
    assert record.tags["rollout_id"] == "r1" and record.tags["phase"] == "serve"
    samples = sdk.TraceSelection([record]).samples(tokenizer, per_call=True)
    assert len(samples) == 2
    assert sorted((s.prompt_ids, s.response_ids, s.old_logprobs) for s in samples) == sorted(
        (p, r.token_ids, r.logprobs) for p, r in engine.answers)
    ledger = closed.json()["segments"]
    assert [seg["response_ids"] for seg in ledger] == [s.response_ids for s in record.segments]
