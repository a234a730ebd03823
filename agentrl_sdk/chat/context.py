"""Context variables that tell a chat model which rollout and which graph node it serves."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl_sdk.chat.recorder import RolloutRecorder


@dataclass(frozen=True)
class NodeTag:
    """Attribution of the LLM calls made inside one graph node."""

    name: str
    policy: str = "default"
    trained: bool = True


current_node: ContextVar[NodeTag | None] = ContextVar("agentrl_node", default=None)
"""Set by ``@trainable`` / ``@frozen`` while the node runs."""

current_recorder: ContextVar[RolloutRecorder | None] = ContextVar(
    "agentrl_recorder", default=None
)
"""Set by the rollout runner for the whole graph run; absent outside rollouts."""
