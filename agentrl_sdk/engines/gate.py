"""`WeightGate`: lets the next step's rollouts start while the trainer updates, on-policy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from agentrl_sdk.engines.base import ForwardingEngine
from agentrl_sdk.types import SamplingParams

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["WeightGate", "held"]


class WeightGate(ForwardingEngine):
    """An `Engine` that forwards to ``engine`` but holds every ``generate`` while closed (a
    held gate does not hold ``load_weights``).

    The on-policy schedule (``sync`` with ``prefetch_rollouts``) holds the gate, starts the
    next step's rollouts (LangGraph start-up, prompt rendering and tokenisation run on the
    otherwise idle driver while the trainer updates in its own process), pushes the new
    weights to ``engine`` and then releases the gate. No token is sampled before the new weights are loaded, so training stays exactly
    on-policy; only the work before each rollout's first LLM call moves earlier.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._open = asyncio.Event()
        self._open.set()
        self._holds = 0  # the step's hold and an evaluation's may nest

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

    async def _admit(self, sampling: SamplingParams) -> SamplingParams:
        """Once the gate is released."""
        await self._open.wait()
        return sampling


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
