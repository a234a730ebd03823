"""`WeightGate`: generate calls wait while it is closed; weight updates go through."""

from __future__ import annotations

import asyncio

from agentrl_sdk.engines.gate import WeightGate
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights.push import StateDict


class _VersionedEngine:
    """Answers every request with the version it was served at (unit-test stand-in)."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None) -> GenerateResult:
        return GenerateResult(token_ids=[1], logprobs=[0.0], finish_reason="length",
                              policy_version=self.policy_version)

    async def load_weights(self, push, version) -> None:
        self.policy_version = version

    async def health(self) -> bool:
        return True


async def test_closed_gate_holds_generate_until_the_new_weights() -> None:
    engine = _VersionedEngine()
    gate = WeightGate(engine)
    assert (await gate.generate([1], SamplingParams(), "a")).policy_version == 0
    gate.hold()
    held = [asyncio.ensure_future(gate.generate([1], SamplingParams(), f"r{i}")) for i in range(4)]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in held)
    await gate.load_weights(StateDict({}), 1)  # not held by the held gate
    gate.release()
    results = await asyncio.wait_for(asyncio.gather(*held), timeout=5)
    assert [r.policy_version for r in results] == [1, 1, 1, 1]
    assert gate.policy_version == 1 and await gate.health()
    assert engine.closed == 0  # holding the gate never closes the engine


async def test_nested_holds_release_with_the_last() -> None:
    gate = WeightGate(_VersionedEngine())
    gate.hold()
    gate.hold()  # an evaluation inside the step's hold
    held = asyncio.ensure_future(gate.generate([1], SamplingParams(), "a"))
    gate.release()
    await asyncio.sleep(0.01)
    assert not held.done()
    gate.release()
    assert (await asyncio.wait_for(held, timeout=5)).token_ids == [1]
