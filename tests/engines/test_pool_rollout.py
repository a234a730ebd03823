"""End-to-end failover: a multi-turn LangGraph rollout over an EnginePool loses a replica midway."""

from __future__ import annotations

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.engines import EnginePool, TorchEngine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.models import load_pretrained_pair
from examples.calculator.agent import build_graph
from tests.gateway.conftest import CALC_ROWS, calc_model_dir

pytestmark = pytest.mark.slow
GREEDY = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48))


class DyingReplica:
    """A TorchEngine replica that records what it returns and dies during its ``die_on``-th
    call: the answer it computed then is lost with it, and its health check fails from then on."""

    def __init__(self, engine: TorchEngine, die_on: int | None = None) -> None:
        self.engine, self.die_on = engine, die_on
        self.calls = 0
        self.alive = True
        self.served: list[tuple[str, list[int], sdk.GenerateResult]] = []

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        self.calls += 1
        if not self.alive:
            raise EngineError(f"replica is down ({request_id!r})")
        result = await self.engine.generate(prompt_ids, sampling, request_id)
        if self.calls == self.die_on:
            self.alive = False
            raise EngineError(f"connection lost during {request_id!r}")
        self.served.append((request_id, list(prompt_ids), result))
        return result

    async def health(self) -> bool:
        return self.alive and await self.engine.health()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _policy() -> TorchEngine:
    """The calculator policy (three tool-using turns on CALC_ROWS) on a fresh TorchEngine."""
    model, _ = load_pretrained_pair(calc_model_dir())
    return TorchEngine(model)


async def test_a_rollout_survives_its_replica_dying_on_a_later_call(qwen_tokenizer) -> None:
    row = CALC_ROWS[0]
    reference_engine = _policy()
    try:
        (reference,) = await sdk.arollout(build_graph(), row, reference_engine,
                                          tokenizer=qwen_tokenizer, config=GREEDY)  # fmt: skip
    finally:
        reference_engine.close()
    assert reference.status == "ok" and len(reference.calls) == 3, reference.error

    # The rollout's first call goes to replica 0 (least loaded, first on ties); it dies on the
    # second call, after computing the answer.
    replicas = [DyingReplica(_policy(), die_on=2), DyingReplica(_policy())]
    pool = EnginePool(replicas)
    try:
        (traj,) = await sdk.arollout(build_graph(), row, pool, tokenizer=qwen_tokenizer,
                                     config=GREEDY)  # fmt: skip
    finally:
        pool.close()

    assert traj.status == "ok", traj.error
    first, *later = traj.calls
    assert len(later) == 2
    # The first call is recorded exactly as replica 0 answered it; the later ones were served
    # by replica 1 (the lost answer of replica 0 is recorded nowhere).
    assert [rid for rid, _, _ in replicas[0].served] == [first.request_id]
    assert [rid for rid, _, _ in replicas[1].served] == [c.request_id for c in later]
    assert replicas[0].calls == 2 and replicas[1].calls == 2
    for call, (_, prompt, result) in zip(traj.calls, replicas[0].served + replicas[1].served,
                                         strict=True):  # fmt: skip
        assert call.prompt_ids == prompt
        assert call.response_ids == result.token_ids
        assert call.response_logprobs == result.logprobs
    assert pool.reroutes == 1 and pool.healthy == [1]
    assert pool.replica_of(f"{traj.row_id}:{traj.sample_index}") == 1  # the rollout's session

    # Nothing lost or repeated: the same trajectory as on one engine that never failed.
    assert [c.request_id for c in traj.calls] == [c.request_id for c in reference.calls]
    assert [(c.prompt_ids, c.response_ids) for c in traj.calls] == [
        (c.prompt_ids, c.response_ids) for c in reference.calls
    ]
    for ours, ref in zip(traj.calls, reference.calls, strict=True):
        assert ours.response_logprobs == pytest.approx(ref.response_logprobs, abs=1e-5)
    (seg,) = traj.segments
    assert seg.generated_ids == [t for c in traj.calls for t in c.response_ids]
    assert seg.prompt_ids == reference.segments[0].prompt_ids
    assert seg.response_ids == reference.segments[0].response_ids
    assert traj.final_state["messages"][-1].content == f"The answer is {row['answer']}."
