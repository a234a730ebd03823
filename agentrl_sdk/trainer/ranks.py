"""`Ranks`: what a `TrainerGroup` needs from wherever its ranks run (Ray actors, `RayRanks`;
or this process, `InProcessRank`)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Ranks"]


class Ranks(Protocol):
    """A trainer group's ranks: calls started on them, their results awaited, and an end."""

    def submit(self, method: str, *args: Any, first_only: bool = False) -> list[Any]:
        """Starts ``method(*args)`` on every rank (rank 0 alone with ``first_only``); one
        handle per rank, for `wait`."""
        ...

    def wait(self, handles: list[Any], method: str, timeout: float) -> list[Any]:
        """The handles' results in rank order within ``timeout`` seconds; a failure raises
        `TrainerError` naming the rank and ``method`` (`RankDiedError` for a dead rank)."""
        ...

    def stop(self, graceful: bool = True) -> None:
        """Ends the ranks (``graceful``: their ``close`` first, within a bound)."""
        ...
