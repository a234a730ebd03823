"""`emit_reward`: a node grants a named reward to the rollout it runs in (per node or step)."""

from __future__ import annotations

import math

from agentrl_sdk.chat.context import current_node, current_recorder


def emit_reward(value: float, name: str | None = None) -> None:
    """Add ``value`` to the rollout's reward component ``name`` (default: the node's name).

    Components add up with the reward function's result into the trajectory's reward.
    Outside a rollout this does nothing, so graphs still run unchanged in production.

    Raises:
        ValueError: ``value`` is not a finite number.
    """
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"emit_reward needs a finite number, got {value!r}")
    recorder = current_recorder.get()
    if recorder is None:
        return
    node = current_node.get()
    recorder.rewards[name or (node.name if node else "graph")] += float(value)
