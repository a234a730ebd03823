"""Trajectories -> training samples: sequences cut as the estimator reads them (trained
segments, or LLM calls), each policy's credited reward, token advantages, per-rollout weights."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from agentrl_sdk.algorithms import Estimator, Sequences, make_estimator
from agentrl_sdk.rollout.credit import PolicyCredit, trainable_credits
from agentrl_sdk.rollout.step_samples import call_samples
from agentrl_sdk.types import Sample, Trajectory


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    estimator: Estimator = make_estimator("grpo"),  # noqa: B008 (frozen, never mutated)
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_flat_groups: bool = False,
) -> tuple[list[Sample], dict[str, float]]:
    """One sample per trained segment (or per trained LLM call, for a ``per_call`` estimator)
    of every scored trajectory, with the estimator's token advantages.

    Each policy's reward for a rollout is what `policy_reward` credits it: the components
    crediting its nodes plus ``outcome_weight`` times the shared outcome. Groups are the
    rollouts of the same dataset row and policy; every sample of a rollout gets a ``weight``
    of ``1 / (its trained segments or calls for that policy)``, so each rollout counts once.
    An estimator that ``needs_values`` leaves every advantage 0 for `with_advantages` to
    replace once a critic has scored the samples.

    Args:
        trajectories: Rollouts with ``reward`` set; those with ``reward`` None are skipped.
        estimator: From `agentrl_sdk.algorithms.make_estimator`.
        policies: Policies to build samples for; all when None.
        outcome_weight: Weight of the shared outcome in every policy's reward.
        drop_flat_groups: Leave out groups whose rewards all agree (dynamic sampling).

    Returns:
        The samples and metrics (``samples``, ``rollouts_skipped``,
        ``groups_dropped_no_signal``, the estimator's statistics).
    """
    credits, counts = trainable_credits(
        trajectories, policies=policies, outcome_weight=outcome_weight,
        drop_flat_groups=drop_flat_groups,
    )  # fmt: skip
    samples, extra = call_samples(credits) if estimator.per_call else _segment_samples(credits)
    if not samples:
        return [], {"samples": 0.0, **counts}
    metrics: dict[str, float] = {}
    if not estimator.needs_values:  # else the critic's values come first (score_values)
        estimate = estimator(Sequences.of(samples, **extra))
        samples, metrics = with_advantages(samples, estimate.advantages), estimate.metrics
    # A call that sampled nothing was there only for its reward: nothing to train.
    samples = [s for s in samples if s.response_ids or not estimator.per_call]
    return samples, {**metrics, "samples": float(len(samples)), **counts}


def with_advantages(
    samples: Sequence[Sample], advantages: Tensor, **aligned: Tensor | None
) -> list[Sample]:
    """``samples`` with their rows of ``advantages`` ``(M, T)`` as token advantages, and the
    rows of each ``aligned`` ``(M, T)`` tensor (``values``, ``returns``; None: left) likewise."""
    rows = {"token_advantages": advantages, **{k: x for k, x in aligned.items() if x is not None}}
    return [s.model_copy(update={name: x[i, : len(s.response_ids)].tolist()
                                 for name, x in rows.items()})
            for i, s in enumerate(samples)]  # fmt: skip


def _segment_samples(credits: Sequence[PolicyCredit]) -> tuple[list[Sample], dict[str, object]]:
    """One sample (zero advantages) per trained segment of every credit."""
    return [
        Sample(
            row_id=c.traj.row_id, sample_index=c.traj.sample_index, policy=c.policy,
            node=seg.node, prompt_ids=seg.prompt_ids, response_ids=seg.response_ids,
            response_mask=seg.response_mask, old_logprobs=seg.response_logprobs,
            response_versions=seg.response_versions,
            token_advantages=[0.0] * len(seg.response_ids), reward=c.reward,
            weight=1.0 / len(c.segments),
        )
        for c in credits
        for seg in c.segments
    ], {}  # fmt: skip
