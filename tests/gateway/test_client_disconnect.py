"""A client that drops its connection mid-request and retries: the dropped call is not
recorded, so the trajectory holds exactly the calls the client saw (found by
benchmarks/soak.py, where the engine's answer to a dropped request landed in the ledger)."""

from __future__ import annotations

import asyncio

import httpx

import agentrl_sdk as sdk
from agentrl_sdk.gateway import Gateway

CONFIG = sdk.RolloutConfig(sampling=sdk.SamplingParams(max_tokens=8, seed=0))
CHAT = {"model": "agentrl", "messages": [{"role": "user", "content": "hello"}]}


class SlowEngine:
    """A scripted engine whose first answer waits until released (the request in flight)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.policy_version = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.answered = 0

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        if not self.started.is_set():
            self.started.set()
            await self.release.wait()
        result = await self.engine.generate(prompt_ids, sampling, request_id)
        self.answered += 1
        return result

    async def health(self) -> bool:
        return True


async def test_a_request_dropped_in_flight_is_not_recorded(scripted, qwen_tokenizer):
    engine = SlowEngine(scripted(qwen_tokenizer, ["first", "second"]))
    async with Gateway(engine, qwen_tokenizer, rollout=CONFIG) as gw:
        gw.open("r0")
        headers = {"Authorization": f"Bearer {gw.api_key}"}
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as client:
            dropped = asyncio.create_task(client.post("/rollouts/r0/v1/chat/completions",
                                                      json=CHAT))  # fmt: skip
            await asyncio.wait_for(engine.started.wait(), 10)
            dropped.cancel()  # httpx closes the connection: the client is gone
            await asyncio.gather(dropped, return_exceptions=True)
            for _ in range(200):  # the gateway sees the disconnect and cancels the call
                if gw.stats.client_disconnects:
                    break
                await asyncio.sleep(0.01)
            engine.release.set()
            retry = await client.post("/rollouts/r0/v1/chat/completions", json=CHAT)
        traj = gw.close("r0")

    assert retry.status_code == 200, retry.text
    assert gw.stats.client_disconnects == 1
    assert engine.answered == 1  # the dropped request never reached the ledger
    assert len(traj.calls) == 1 and len(traj.segments) == 1
    assert qwen_tokenizer.decode(traj.calls[0].response_ids).startswith("first")
    assert traj.status == "ok"
