"""Staleness bookkeeping of the fully-async pipeline: whose weights sampled a token, how old it
is when trained, and whether a new row may start."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from agentrl_sdk.types import Trajectory


class VersionSteps:
    """Per policy, which trainer step's weights each engine ``policy_version`` served.

    Engines count their own versions (one per weight push); the staleness bound is in
    trainer updates. Every push records ``version -> step`` here.
    """

    def __init__(self) -> None:
        self._steps: dict[str, dict[int, int]] = {}

    def record(self, policy: str, version: int, step: int) -> None:
        """The engine of ``policy`` serves the weights after ``step`` updates as ``version``."""
        self._steps.setdefault(policy, {})[version] = step

    def step_of(self, policy: str, version: int) -> int:
        """The trainer step of ``policy``'s engine ``version``.

        Raises:
            KeyError: The version was never recorded (a token from an unknown engine state).
        """
        try:
            return self._steps[policy][version]
        except KeyError:
            raise KeyError(
                f"policy {policy!r} sampled with engine version {version}, which no weight "
                f"push recorded (known: {sorted(self._steps.get(policy, {}))})"
            ) from None


def sampled_steps(
    trajectories: Iterable[Trajectory], versions: VersionSteps, policies: Sequence[str]
) -> list[int]:
    """The trainer steps whose weights sampled the trained tokens of ``policies``, sorted."""
    steps: set[int] = set()
    for trajectory in trajectories:
        for segment in trajectory.trained_segments:
            if segment.policy in policies:
                steps.update(
                    versions.step_of(segment.policy, v)
                    for v, m in zip(segment.response_versions, segment.response_mask, strict=True)
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
