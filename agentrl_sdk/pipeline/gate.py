"""`WeightGate`: lets the next step's rollouts start while the trainer updates, on-policy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    from agentrl_sdk.engines import Engine
    from agentrl_sdk.weights.push import WeightIntake, WeightPush

__all__ = ["WeightGate", "held"]


class WeightGate:
    """An `Engine` that forwards to ``engine`` but holds every ``generate`` while closed.

    The on-policy schedule (``sync`` with ``prefetch_rollouts``) holds the gate, starts the
    next step's rollouts (LangGraph start-up, prompt rendering and tokenisation run on the
    otherwise idle driver while the trainer updates in its own process), pushes the new
    weights to ``engine`` and then releases the gate. No token is sampled before the new weights are loaded, so training stays exactly
    on-policy; only the work before each rollout's first LLM call moves earlier.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open = asyncio.Event()
        self._open.set()
        self._holds = 0  # the step's hold and an evaluation's may nest

    @property
    def policy_version(self) -> int:
        """The wrapped engine's policy version."""
        return self.engine.policy_version

    def hold(self) -> None:
        """Hold new ``generate`` calls until the matching `release` (calls already inside the
        engine go on)."""
        self._holds += 1
        self._open.clear()

    def release(self) -> None:
        """End one `hold`; the last releases every held call and lets new ones through."""
        self._holds = max(self._holds - 1, 0)
        if not self._holds:
            self._open.set()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """The engine's ``generate``, once the gate is released."""
        await self._open.wait()
        return await self.engine.generate(
            prompt_ids, sampling, request_id, session_id=session_id
        )

    @property
    def weight_intake(self) -> WeightIntake:
        """The engine's."""
        return self.engine.weight_intake

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """The engine's ``load_weights``; a held gate does not hold it."""
        await self.engine.load_weights(push, version)

    async def pause(self) -> None:
        """The engine's ``pause`` (requests already inside keep their partial output)."""
        await self.engine.pause()

    async def resume(self) -> None:
        """The engine's ``resume``."""
        await self.engine.resume()

    async def health(self) -> bool:
        """The engine's health."""
        return await self.engine.health()

    def close(self) -> None:
        """Close the engine."""
        self.engine.close()


@contextlib.contextmanager
def held(gates: Iterable[WeightGate]) -> Iterator[None]:
    """Hold every gate in ``gates`` for the block; each is released however the block ends."""
    gates = list(gates)
    for gate in gates:
        gate.hold()
    try:
        yield
    finally:
        for gate in gates:
            gate.release()
