"""Concurrent rollouts of a graph over dataset rows."""

from agentrl_sdk.rollout.runner import (
    arollout,
    arollout_batch,
    default_input,
    rollout,
    row_id_of,
)

__all__ = ["arollout", "arollout_batch", "default_input", "rollout", "row_id_of"]
