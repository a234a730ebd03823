"""The trainer's pure step from finished groups to a batch: credit, signal, samples, advantages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from agentrl_sdk.algorithms import Estimator, Sequences
from agentrl_sdk.pipeline.policies import metric_prefix
from agentrl_sdk.rollout.credit import GroupKey, PolicyCredit, credit_policies, flat_groups
from agentrl_sdk.rollout.overlong import truncated
from agentrl_sdk.rollout.samples import samples_of, with_advantages
from agentrl_sdk.types import Sample, Trajectory

__all__ = ["GroupCredit", "advantages", "batch_samples", "credit_rollouts"]


@dataclass(frozen=True)
class GroupCredit:
    """Scored rollouts' credit per policy, made once when the trainer takes their group: what
    dynamic sampling asks of the group and what its samples are cut from.

    Attributes:
        credits: Each trainable rollout's credit for each policy it trained.
        flat: The ``(row, policy)`` groups whose rewards all agree (no signal).
        unscored: Trainable rollouts without a reward (left out).
        truncated: Rollouts left out as truncated (``overlong.drop_truncated``).
    """

    credits: list[PolicyCredit]
    flat: frozenset[GroupKey]
    unscored: int = 0
    truncated: int = 0

    @property
    def has_signal(self) -> bool:
        """Whether some ``(row, policy)`` group's rewards differ: its advantages are not all 0."""
        return any(c.group not in self.flat for c in self.credits)


def credit_rollouts(
    trajectories: Sequence[Trajectory],
    *,
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_truncated: bool = False,
) -> GroupCredit:
    """The credit of ``trajectories`` for ``policies`` (all when None): `credit_policies` of the
    trainable ones (truncated ones left out when ``drop_truncated``), and the flat groups."""
    kept = [t for t in trajectories if not (drop_truncated and truncated(t))]
    credits = credit_policies(kept, policies=policies, outcome_weight=outcome_weight)
    return GroupCredit(
        credits, frozenset(flat_groups(credits)), unscored=sum(t.reward is None for t in kept),
        truncated=len(trajectories) - len(kept),
    )  # fmt: skip


def batch_samples(
    groups: Sequence[GroupCredit], *, per_call: bool, drop_flat: bool = False
) -> tuple[list[Sample], dict[str, object], dict[str, float]]:
    """The samples (zero advantages) of ``groups``' credits, in order, flat groups left out when
    ``drop_flat`` (dynamic sampling); the `Sequences` fields they add; and the counts
    ``rollouts_skipped`` (unscored), ``rollouts_dropped_truncated`` and
    ``groups_dropped_no_signal``."""
    credits = [c for g in groups for c in g.credits if not (drop_flat and c.group in g.flat)]
    samples, extra = samples_of(credits, per_call=per_call)
    return samples, extra, {
        "rollouts_skipped": float(sum(g.unscored for g in groups)),
        "rollouts_dropped_truncated": float(sum(g.truncated for g in groups)),
        "groups_dropped_no_signal": float(sum(len(g.flat) for g in groups) if drop_flat else 0),
    }


def advantages(
    samples: list[Sample],
    extra: Mapping[str, object],
    estimator: Estimator,
    values: Mapping[str, Tensor] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """``samples`` with the estimator's token advantages: the one place they are made.

    An estimator that reads a critic's values (``needs_values``) is called per policy, on the
    ``(M, T)`` ``values`` of that policy's samples (in order), and keeps its returns; its
    metrics go under ``critic/`` (``critic/<policy>/``). Any other is called once on the whole
    batch with ``extra`` (`batch_samples`). Metrics: the estimator's, and ``samples``.
    """
    if not samples:
        return [], {"samples": 0.0}
    if estimator.needs_values:
        samples, metrics = _with_values(samples, estimator, values or {})
    else:
        estimate = estimator(Sequences.of(samples, **extra))
        samples, metrics = with_advantages(samples, estimate.advantages), estimate.metrics
    # A call that sampled nothing was there only for its reward: nothing to train.
    samples = [s for s in samples if s.response_ids or not estimator.per_call]
    return samples, {**metrics, "samples": float(len(samples))}


def _with_values(
    samples: list[Sample], estimator: Estimator, values: Mapping[str, Tensor]
) -> tuple[list[Sample], dict[str, float]]:
    """Per policy with ``values``: its samples' advantages and returns (the others left as
    they are), and the estimator's metrics under the policy's ``critic/`` prefix."""
    out, metrics = list(samples), {}
    for name, policy_values in values.items():
        mine = [i for i, s in enumerate(samples) if s.policy == name]
        own = [samples[i] for i in mine]
        estimate = estimator(Sequences.of(own, values=policy_values))
        metrics |= {f"{metric_prefix('critic', name)}{k}": v for k, v in estimate.metrics.items()}
        scored = with_advantages(own, estimate.advantages, values=policy_values,
                                 returns=estimate.returns)  # fmt: skip
        for i, s in zip(mine, scored, strict=True):
            out[i] = s
    return out, metrics
