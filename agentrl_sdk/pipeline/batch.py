"""From the trainer's finished groups to a training batch: credit, signal and advantages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentrl_sdk.algorithms.config import AlgorithmConfig
from agentrl_sdk.pipeline.critic import score_values
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.rollout.credit import credit_policies, flat_groups
from agentrl_sdk.rollout.overlong import truncated
from agentrl_sdk.rollout.samples import build_samples
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Sample, Trajectory

__all__ = ["batch_samples", "rows_with_signal", "trainable"]


def trainable(trajectories: list[Trajectory], algorithm: AlgorithmConfig) -> list[Trajectory]:
    """The rollouts training may use: truncated ones left out when configured."""
    if not algorithm.overlong.drop_truncated:
        return trajectories
    return [t for t in trajectories if not truncated(t)]


def rows_with_signal(
    trajectories: list[Trajectory], policies: Sequence[str], algorithm: AlgorithmConfig
) -> list[str]:
    """The rows (first-seen order) with at least one ``(row, policy)`` group whose rewards
    differ: what dynamic sampling counts toward a batch."""
    credits = credit_policies(
        trainable(trajectories, algorithm), policies=policies,
        outcome_weight=algorithm.outcome_reward_weight,
    )  # fmt: skip
    flat = flat_groups(credits)
    return list(dict.fromkeys(c.traj.row_id for c in credits if c.group not in flat))


async def batch_samples(
    trajectories: list[Trajectory],
    rollout_s: float,
    policies: Sequence[str],
    algorithm: AlgorithmConfig,
    critics: Mapping[str, CriticGroup],
) -> tuple[list[Sample], dict[str, float]]:
    """The step's training samples with the estimator's token advantages (from the critics'
    values, when it reads them: `score_values`), and the rollout and estimator metrics."""
    kept = trainable(trajectories, algorithm)
    dropped = len(trajectories) - len(kept)
    samples, sample_metrics = build_samples(
        kept, estimator=algorithm.estimator, policies=policies,
        outcome_weight=algorithm.outcome_reward_weight,
        drop_flat_groups=algorithm.dynamic_sampling.enabled,
    )  # fmt: skip
    sample_metrics["rollouts_dropped_truncated"] = float(dropped)
    samples, critic_metrics = await score_values(critics, algorithm.estimator, samples)
    return samples, {**rollout_metrics(trajectories, rollout_s), **sample_metrics,
                     **critic_metrics}
