"""What a rebuilt trainer group needs to reach the state of the one that died: the last
checkpoint of each adapter and the updates made since (their batches; token ids, small next to
the weights), at most ``max_replay_updates`` of them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentrl_sdk.trainer.errors import TrainerError

__all__ = ["ReplayLog"]

logger = logging.getLogger(__name__)


class ReplayLog:
    """Per adapter (None: the group's only or first one), its checkpoint and later updates.

    Args:
        max_updates: Updates kept in all; one more and the adapters whose updates were dropped
            cannot be rebuilt until their next checkpoint.
        enabled: False (no restarts allowed): nothing is kept.
    """

    def __init__(self, max_updates: int, enabled: bool = True) -> None:
        self.max_updates = max_updates
        self.enabled = enabled
        self.checkpoints: dict[str | None, str] = {}
        self.updates: list[tuple[str | None, Any]] = []
        self.unreplayable: set[str | None] = set()

    def checkpointed(self, adapter: str | None, folder: str) -> None:
        """``adapter``'s state is ``folder`` now: its earlier updates need no replay."""
        self.checkpoints[adapter] = folder
        self.updates = [(a, batch) for a, batch in self.updates if a != adapter]
        self.unreplayable.discard(adapter)

    def remember(self, adapter: str | None, batch: Any) -> None:
        """Keep an update's batch for a rebuild's replay, up to ``max_updates``."""
        if adapter in self.unreplayable or not self.enabled:
            return
        if len(self.updates) >= self.max_updates:
            # Bounded memory: the adapters with dropped updates cannot be rebuilt until
            # their next checkpoint.
            self.unreplayable |= {a for a, _ in self.updates} | {adapter}
            self.updates.clear()
            logger.warning("more than %d updates since the last checkpoint "
                           "(trainer.max_replay_updates): a dead rank now ends the run",
                           self.max_updates)  # fmt: skip
            return
        self.updates.append((adapter, batch))

    def check(self, cause: Exception) -> None:
        """Raises `TrainerError` (from ``cause``) when some adapter cannot be rebuilt."""
        if self.unreplayable:
            raise TrainerError(
                f"{cause}; more than trainer.max_replay_updates={self.max_updates} updates "
                "since the last checkpoint cannot be replayed: checkpoint more often, resume "
                "from the last one"
            ) from cause

    def replay(
        self, load: Callable[[str | None, str], Any], update: Callable[[str | None, Any], Any]
    ) -> None:
        """Brings new ranks to the logged state: ``load(adapter, folder)`` of each checkpoint,
        then ``update(adapter, batch)`` of every update since, on the same batches."""
        for adapter, folder in self.checkpoints.items():
            load(adapter, folder)
        for adapter, batch in self.updates:
            update(adapter, batch)
        logger.warning("trainer group rebuilt: %s, %d update(s) replayed",
                       sorted(self.checkpoints.values()) or "from the model", len(self.updates))
