"""Context variables that tell a chat model which rollout and which graph node it serves."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

# NodeTag lives with the rest of attribution; importing it here also keeps it importable from
# this module, where it used to be defined.
from agentrl_sdk.chat.attribution import NodeTag

if TYPE_CHECKING:
    from agentrl_sdk.chat.recorder import RolloutRecorder

__all__ = ["NodeTag", "current_node", "current_recorder"]

current_node: ContextVar[NodeTag | None] = ContextVar("agentrl_node", default=None)
"""Set by ``@trainable`` / ``@frozen`` while the node runs."""

current_recorder: ContextVar[RolloutRecorder | None] = ContextVar(
    "agentrl_recorder", default=None
)
"""Set by the rollout runner for the whole graph run; absent outside rollouts."""
