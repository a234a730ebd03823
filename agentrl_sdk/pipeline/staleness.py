"""Staleness rules of the fully-async pipeline: whose weights sampled a token, how old it is
when trained, and whether a new row may start."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from agentrl_sdk.types import Trajectory


def sampled_steps(trajectories: Iterable[Trajectory], policies: Sequence[str]) -> list[int]:
    """The trainer steps whose weights sampled the trained tokens of ``policies``, sorted: a
    token's policy version is the updates its weights had seen (the driver's push version)."""
    steps: set[int] = set()
    for trajectory in trajectories:
        for segment in trajectory.trained_segments:
            if segment.policy in policies:
                steps.update(
                    v for v, m in zip(segment.response_versions, segment.response_mask, strict=True)
                    if m
                )
    return sorted(steps)


def may_admit(
    live_groups: int, served_step: int, batch_size: int, max_staleness: int
) -> bool:
    """Whether one more group (a row's ``n`` rollouts) may start.

    A group started while the engines serve the weights of step ``served_step`` and trained at
    step ``k`` is ``k - served_step`` updates stale. Groups are trained ``batch_size`` per step
    in about the order they start, so at most ``(served_step + max_staleness + 1) *
    batch_size`` groups may ever have been started and not dropped (``live_groups``: trained,
    queued or in flight); AReaL bounds its rollouts the same way. A group that finishes out of
    order can still arrive too late; the trainer checks every group when it takes it.
    """
    return live_groups < (served_step + max_staleness + 1) * batch_size


def staleness_metrics(staleness: Sequence[int]) -> dict[str, float]:
    """Histogram (``staleness/<k>``: groups trained ``k`` updates late), mean and max."""
    if not staleness:
        return {}
    counts = Counter(staleness)
    metrics = {f"staleness/{k}": float(c) for k, c in sorted(counts.items())}
    metrics["staleness/mean"] = sum(staleness) / len(staleness)
    metrics["staleness/max"] = float(max(staleness))
    return metrics
