"""An OpenAI-client agent function served through the recording gateway: its trace holds the
request's input and output and exactly the ids and logprobs the real engine returned."""

from __future__ import annotations

import asyncio

import httpx

import agentrl_sdk as sdk
from tests.serving.conftest import ROLLOUT, ensure_experiment


async def chat_twice(endpoint, request):
    """Ask, then ask again with the reply in the conversation (an ordinary OpenAI client)."""
    client = endpoint.client(max_retries=0, timeout=60)
    messages = [{"role": "user", "content": request["question"]}]
    first = await client.chat.completions.create(model=endpoint.model, messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Shorter."}]
    second = await client.chat.completions.create(model=endpoint.model, messages=messages)
    return {"answer": second.choices[0].message.content}


async def _ask(engine, tokenizer, store):
    config = sdk.ServeConfig(port=0, tracking_uri=store, experiment="agents")
    async with sdk.GraphServer(chat_twice, engine, tokenizer=tokenizer, config=config,
                               rollout=ROLLOUT) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            reply = await client.post("/invoke", json={"input": {"question": "Hi?"}})
    return reply


def test_an_agent_functions_trace_holds_the_engines_ids(engine, tokenizer, store):
    ensure_experiment(store, "agents")
    reply = asyncio.run(_ask(engine, tokenizer, store))
    assert reply.status_code == 200
    answer = reply.json()
    assert answer["status"] == "ok" and isinstance(answer["output"]["answer"], str)

    [record] = sdk.traces(store, experiment="agents", reward=lambda r: 1.0).records
    assert record.trace_id == answer["trace_id"]
    assert record.inputs == {"question": "Hi?"} and record.outputs == answer["output"]
    samples = sdk.TraceSelection([record]).samples(tokenizer, per_call=True)
    assert sorted((s.prompt_ids, s.response_ids, s.old_logprobs) for s in samples) == sorted(
        (p, r.token_ids, r.logprobs) for p, r in engine.answers)
    assert len(samples) == 2
