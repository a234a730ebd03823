"""The trainer's errors."""

from __future__ import annotations

from agentrl_sdk.errors import AgentRLError

__all__ = ["RankDiedError", "TrainerError"]


class TrainerError(AgentRLError):
    """A policy worker failed or did not answer in time; the message names the rank."""


class RankDiedError(TrainerError):
    """A worker's process died (killed, out of memory): the group must be rebuilt."""
