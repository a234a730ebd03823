"""The trainer's errors."""

from __future__ import annotations

from collections.abc import Sequence

from agentrl_sdk.errors import AgentRLError

__all__ = ["RankDiedError", "TrainerError"]


class TrainerError(AgentRLError):
    """A policy worker failed or did not answer in time; the message names the rank."""

    @classmethod
    def timed_out(cls, method: str, timeout: float, ranks: Sequence[int]) -> TrainerError:
        """``method`` still ran on ``ranks`` after ``timeout`` seconds."""
        return cls(
            f"trainer {method} timed out after {timeout:.0f}s waiting for ranks {list(ranks)}; "
            "raise TrainerConfig.call_timeout_s if the work is just slow"
        )

    @classmethod
    def rank_failed(
        cls, rank: int, method: str, cause: BaseException, also: Sequence[int] = ()
    ) -> TrainerError:
        """``method`` raised ``cause`` on ``rank`` (and failed on the ranks ``also``)."""
        return cls(
            f"trainer rank {rank} failed in {method}: {type(cause).__name__}: {cause}"
            + (f" (ranks {list(also)} failed too)" if also else "")
        )


class RankDiedError(TrainerError):
    """A worker's process died (killed, out of memory): the group must be rebuilt."""

    @classmethod
    def during(
        cls, rank: int, method: str, cause: BaseException, failed_rank: int | None = None
    ) -> RankDiedError:
        """``rank`` died in ``method`` (``cause``: Ray's error for it, or the failure the
        death caused on ``failed_rank``, which Ray reported first)."""
        seen = "" if failed_rank is None else f"rank {failed_rank} then failed: "
        first_line = next(iter(str(cause).splitlines()), "")
        return cls(f"trainer rank {rank} died during {method} "
                   f"({seen}{type(cause).__name__}: {first_line})")
