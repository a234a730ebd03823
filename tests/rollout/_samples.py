"""The batch step of `agentrl_sdk.pipeline.batch` on one set of scored rollouts, for tests."""

from __future__ import annotations

from collections.abc import Sequence

from agentrl_sdk.algorithms import Estimator, make_estimator
from agentrl_sdk.pipeline.batch import advantages, batch_samples, credit_rollouts
from agentrl_sdk.types import Sample, Trajectory


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    estimator: Estimator = make_estimator("grpo"),  # noqa: B008 (frozen)
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_flat_groups: bool = False,
) -> tuple[list[Sample], dict[str, float]]:
    """The samples of ``trajectories`` (one group, no critic) with their advantages, and the
    metrics of the step."""
    credit = credit_rollouts(trajectories, policies=policies, outcome_weight=outcome_weight)
    samples, extra, counts = batch_samples(
        [credit], per_call=estimator.per_call, drop_flat=drop_flat_groups
    )
    samples, metrics = advantages(samples, extra, estimator)
    return samples, {**metrics, **counts}
