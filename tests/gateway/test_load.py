"""Load: 256 concurrent chat requests through the gateway, none lost, none mixed between rollouts."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.gateway import Gateway

pytestmark = pytest.mark.asyncio(loop_scope="session")
ROLLOUTS, PER_ROLLOUT = 64, 4  # 256 requests in flight at once
CONFIG = sdk.RolloutConfig(sampling=sdk.SamplingParams(max_tokens=4, seed=7))


async def test_256_concurrent_requests_land_in_their_own_rollouts(random_engine, qwen_tokenizer):
    async with Gateway(random_engine, qwen_tokenizer, rollout=CONFIG) as gw:
        for r in range(ROLLOUTS):
            gw.open(f"r{r}")
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
        headers = {"Authorization": f"Bearer {gw.api_key}"}
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, limits=limits,
                                     timeout=120) as client:

            async def ask(r: int, k: int) -> tuple[int, int, dict]:
                body = {"model": "agentrl",
                        "messages": [{"role": "user", "content": f"rollout {r} question {k}"}]}
                # Half by path, half by header: both routings under the same load.
                if k % 2:
                    reply = await client.post(f"/rollouts/r{r}/v1/chat/completions", json=body)
                else:
                    reply = await client.post("/v1/chat/completions", json=body,
                                              headers={"X-Rollout-Id": f"r{r}"})
                assert reply.status_code == 200, reply.text
                return r, k, reply.json()

            replies = await asyncio.wait_for(asyncio.gather(
                *(ask(r, k) for r in range(ROLLOUTS) for k in range(PER_ROLLOUT))
            ), timeout=300)
        trajectories = {r: gw.close(f"r{r}") for r in range(ROLLOUTS)}

    assert len(replies) == ROLLOUTS * PER_ROLLOUT
    for r, traj in trajectories.items():
        # Every request of rollout r, and only those, is in r's ledger.
        asked = sorted(_question(qwen_tokenizer.decode(c.prompt_ids)) for c in traj.calls)
        assert asked == [(r, k) for k in range(PER_ROLLOUT)]
        assert traj.status == "ok" and len(traj.segments) == PER_ROLLOUT
    for r, k, body in replies:
        (call,) = [c for c in trajectories[r].calls
                   if _question(qwen_tokenizer.decode(c.prompt_ids)) == (r, k)]
        # Each client got the answer recorded for its own request.
        assert body["usage"]["completion_tokens"] == len(call.response_ids)
        assert body["choices"][0]["message"]["content"] == _content(qwen_tokenizer, call)


def _question(prompt: str) -> tuple[int, int]:
    found = re.findall(r"rollout (\d+) question (\d+)", prompt)
    assert len(found) == 1, prompt
    return int(found[0][0]), int(found[0][1])


def _content(tokenizer, call) -> str:
    ids = call.response_ids[:-1] if call.finish_reason == "stop" else call.response_ids
    return tokenizer.decode(ids, skip_special_tokens=False).strip()
