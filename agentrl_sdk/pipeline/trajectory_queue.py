"""The bounded queue between the fully-async rollouter and trainer, and what a checkpoint keeps
of it."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

from agentrl_sdk.types import Trajectory


class FinishedGroup(BaseModel):
    """A row's ``n`` rollouts, scored, waiting to be trained."""

    index: int = Field(description="Admission order; a batch is trained in this order.")
    row: dict[str, Any]
    trajectories: list[Trajectory]
    counts: dict[str, float] = Field(default_factory=dict, description="Reward outcome counts.")
    admitted_step: int = Field(description="Trainer step of the weights served at admission.")
    oldest_step: int = Field(description="Trainer step of the oldest weights that sampled a "
                             "trained token (admitted_step when none was).")  # fmt: skip
    mixed_versions: int = Field(0, description="Rollouts whose trained tokens span versions.")

    def staleness(self, step: int) -> int:
        """Updates between the oldest weights that sampled this group and step ``step``."""
        return step - self.oldest_step


class PendingRow(BaseModel):
    """A row drawn from the loader whose group has not finished (resumed runs restart it)."""

    index: int
    row: dict[str, Any]
    engine_retries: int = Field(0, description="Times its rollouts were started again because "
                                "an engine failed under them.")  # fmt: skip


class PipelineState(BaseModel):
    """What the fully-async pipeline checkpoints besides the trainer: nothing finished is lost
    and nothing trained is trained again after a resume."""

    next_index: int = 0
    queued: list[FinishedGroup] = Field(default_factory=list)
    pending: list[PendingRow] = Field(default_factory=list)
    dropped_stale: int = 0
    retried_stale: int = 0
    engine_retries: int = 0


class GroupQueue:
    """Finished groups in arrival order, at most ``capacity``; `put` waits while full."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._groups: list[FinishedGroup] = []
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._groups)

    def snapshot(self) -> list[FinishedGroup]:
        """The queued groups, oldest first (a copy)."""
        return list(self._groups)

    async def put(self, group: FinishedGroup) -> None:
        """Append ``group`` once there is room."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) < self.capacity)
            self._groups.append(group)
            self._changed.notify_all()

    async def get(self) -> FinishedGroup:
        """Remove and return the oldest group, waiting for one."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._groups))
            group = self._groups.pop(0)
            self._changed.notify_all()
            return group

    def put_back(self, groups: list[FinishedGroup]) -> None:
        """Return taken ``groups`` to the front, in their order (room or not: they had it)."""
        self._groups[:0] = groups
