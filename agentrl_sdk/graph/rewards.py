"""`emit_reward`: a node grants a named reward that credits a node (by default its own), one of
the node's LLM calls, or the whole rollout."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.attribution import graph_path
from agentrl_sdk.chat.context import current_node, current_recorder
from agentrl_sdk.types import RewardComponent

if TYPE_CHECKING:
    from agentrl_sdk.chat.recorder import RolloutRecorder


class _Emitting(Enum):
    NODE = "the emitting node"


EMITTING_NODE = _Emitting.NODE
"""``emit_reward``'s default ``node``: the node the call is made from."""


def emit_reward(
    value: Any,
    name: str | None = None,
    *,
    node: str | None | _Emitting = EMITTING_NODE,
    step: int | None = None,
) -> None:
    """Add ``value`` to the rollout's reward component ``name``, crediting ``node``.

    Components crediting a node go to that node's policy only (with the shared outcome);
    ``node=None`` makes the reward part of the shared outcome every policy of the rollout
    earns. ``step`` credits one LLM call of the node: its ``step``-th (``LLMCall.turn``), or
    counted from its latest when negative (``-1``: the call it just made). All components add
    up into ``Trajectory.reward``, the total that is logged. Outside a rollout this does
    nothing, so graphs still run unchanged in production.

    Args:
        value: Any finite real number (int, float, bool, numpy or torch scalar).
        name: The component's name; default: the credited node's name (``graph`` if none).
        node: The node credited; default the emitting node; None shares the reward.
        step: The node's LLM call credited; None credits all its calls.

    Raises:
        ValueError: ``value`` is not a finite number, or ``step`` names a call not made.
    """
    recorder = current_recorder.get()
    if recorder is None:
        RewardComponent(name=name or "graph", value=value)  # refuses what a rollout would
        return
    credited = _emitting_node(recorder) if node is EMITTING_NODE else node
    component = RewardComponent(name=name or credited or "graph", value=value, node=credited)
    if step is not None:
        made = sum(call.node == credited for call in recorder.ledger.calls)
        turn = step + made if step < 0 else step
        if credited is None or not 0 <= turn < made:
            raise ValueError(f"emit_reward(step={step}) credits no LLM call: node {credited!r} "
                             f"has made {made} so far")
        component = component.model_copy(update={"step": turn})
    recorder.components.append(component)


def _emitting_node(recorder: RolloutRecorder) -> str | None:
    """The node running now, named as its LLM calls are (decorator, else graph path and
    ``rollout.nodes`` rules); None outside any graph node."""
    if (tag := current_node.get()) is not None:
        return tag.name
    from langgraph.config import get_config

    try:
        path = graph_path(get_config().get("metadata"))
    except RuntimeError:  # not inside a runnable
        return None
    return None if path is None else recorder.node_at(path).name
