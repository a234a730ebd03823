"""The gateway in front of an EnginePool: each rollout's calls stay on one replica, and its
trajectory holds exactly what that replica generated."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.engines import EnginePool, TorchEngine
from agentrl_sdk.gateway import Gateway
from agentrl_sdk.models import build_tiny_model
from tests.gateway.conftest import RecordingEngine

pytestmark = pytest.mark.asyncio(loop_scope="session")
CONFIG = sdk.RolloutConfig(sampling=sdk.SamplingParams(max_tokens=6, seed=3))
ROLLOUTS, TURNS = 8, 3


async def test_rollouts_stick_to_a_replica_and_record_its_tokens(qwen_tokenizer):
    engines = [TorchEngine(build_tiny_model(qwen_tokenizer, hidden_size=32, num_layers=1, seed=s))
               for s in (1, 2)]  # fmt: skip
    replicas = [RecordingEngine(e) for e in engines]
    pool = EnginePool(replicas)
    try:
        async with Gateway(pool, qwen_tokenizer, rollout=CONFIG) as gw:
            for r in range(ROLLOUTS):
                gw.open(f"r{r}")
            headers = {"Authorization": f"Bearer {gw.api_key}"}
            async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=120) as client:

                async def converse(r: int) -> None:
                    messages = [{"role": "user", "content": f"rollout {r}"}]
                    for _ in range(TURNS):  # each reply goes back: the ledger extends
                        reply = await client.post(f"/rollouts/r{r}/v1/chat/completions",
                                                  json={"model": "agentrl", "messages": messages})
                        assert reply.status_code == 200, reply.text
                        messages += [reply.json()["choices"][0]["message"],
                                     {"role": "user", "content": "more"}]

                await asyncio.wait_for(asyncio.gather(*(converse(r) for r in range(ROLLOUTS))),
                                       timeout=300)  # fmt: skip
            trajectories = [gw.close(f"r{r}") for r in range(ROLLOUTS)]
    finally:
        for engine in engines:
            engine.close()

    served = [{tuple(p): res for p, res in rep.answered} for rep in replicas]
    used = set()
    for traj in trajectories:
        assert traj.status == "ok" and len(traj.calls) == TURNS
        homes = [i for i, s in enumerate(served) if tuple(traj.calls[0].prompt_ids) in s]
        assert len(homes) == 1
        home = served[homes[0]]
        used.add(homes[0])
        for call in traj.calls:  # every call on the same replica, recorded as it answered
            result = home[tuple(call.prompt_ids)]
            assert call.response_ids == result.token_ids
            assert call.response_logprobs == result.logprobs
        assert len(traj.segments) == 1  # follow-ups extended the ledger
    assert used == {0, 1}  # least loaded first: both replicas took rollouts
    assert sum(len(s) for s in served) == ROLLOUTS * TURNS
