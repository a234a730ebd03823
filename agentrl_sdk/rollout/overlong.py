"""Over-long responses (DAPO, arXiv:2503.14476): a soft penalty as a response nears its token
budget, and the truncated rollouts a run may leave out of training."""

from __future__ import annotations

from collections.abc import Sequence

from agentrl_sdk.types import RewardComponent, Trajectory

OVERLONG = "overlong"
"""Name of the penalty component (metrics show it as ``reward/overlong``)."""


def truncated(traj: Trajectory) -> bool:
    """Whether the rollout's last LLM call ran out of tokens (``finish_reason`` length)."""
    return bool(traj.calls) and traj.calls[-1].finish_reason == "length"


def overlong_penalty(length: int, max_length: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft over-long punishment of a response of ``length`` tokens.

    ``0`` while ``length <= max_length - buffer``; then linear down to ``-penalty`` at
    ``max_length``: ``-penalty * (length - (max_length - buffer)) / buffer``. ``buffer`` 0
    turns it off.
    """
    start = max_length - buffer
    if buffer <= 0 or length <= start:
        return 0.0
    return -penalty * min(length - start, buffer) / buffer


def add_overlong_penalties(
    trajectories: Sequence[Trajectory], *, max_length: int, buffer: int, penalty: float = 1.0
) -> int:
    """Penalise every trained LLM call of each scored rollout by `overlong_penalty`, in place;
    returns the number of calls penalised.

    The penalty credits the call's node and step (the node that wrote the long response pays,
    not the other policies of the rollout) and is added to ``reward``.
    """
    penalised = 0
    for traj in trajectories:
        if traj.reward is None:
            continue
        for call in traj.calls:
            if not call.trained:
                continue
            value = overlong_penalty(len(call.response_ids), max_length, buffer, penalty)
            if value == 0.0:
                continue
            traj.components.append(
                RewardComponent(name=OVERLONG, value=value, node=call.node, step=call.turn))
            traj.reward += value
            penalised += 1
    return penalised
