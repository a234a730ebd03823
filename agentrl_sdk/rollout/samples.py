"""Trajectories -> training samples: group advantages per (row, policy) over each policy's
credited reward, per-rollout weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl_sdk.algorithms import compute_advantages
from agentrl_sdk.rollout.credit import trainable_credits
from agentrl_sdk.types import Sample, Trajectory


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    estimator: str = "grpo",
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_flat_groups: bool = False,
) -> tuple[list[Sample], dict[str, float]]:
    """One sample per trained segment of every scored trajectory.

    Each policy's reward for a rollout is what `policy_reward` credits it: the components
    crediting its nodes plus ``outcome_weight`` times the shared outcome. Advantages are
    computed over the rollouts of the same dataset row and policy; every segment of a rollout
    gets that rollout's advantage and a ``weight`` of ``1 / (its trained segments for that
    policy)``, so each rollout counts once.

    Args:
        trajectories: Rollouts with ``reward`` set; those with ``reward`` None are skipped.
        estimator: Advantage estimator name (``grpo``, ``drgrpo``, ``rloo``; ``gae`` leaves
            every advantage 0 for the critic's token advantages to replace).
        policies: Policies to build samples for; all when None.
        outcome_weight: Weight of the shared outcome in every policy's reward.
        drop_flat_groups: Leave out groups whose rewards all agree (dynamic sampling).

    Returns:
        The samples and metrics (``samples``, ``rollouts_skipped``,
        ``groups_dropped_no_signal``, advantage statistics).
    """
    credits, counts = trainable_credits(
        trajectories, policies=policies, outcome_weight=outcome_weight,
        drop_flat_groups=drop_flat_groups,
    )  # fmt: skip
    if not credits:
        return [], {"samples": 0.0, **counts}

    rewards = torch.tensor([c.reward for c in credits], dtype=torch.float64)
    if estimator == "gae":  # token advantages come later, from a critic's values (compute_gae)
        adv, metrics = torch.zeros_like(rewards), {}
    else:
        adv, metrics = compute_advantages(estimator, rewards, [c.group for c in credits])
    samples = [
        Sample(
            row_id=c.traj.row_id,
            sample_index=c.traj.sample_index,
            policy=c.policy,
            node=seg.node,
            prompt_ids=seg.prompt_ids,
            response_ids=seg.response_ids,
            response_mask=seg.response_mask,
            old_logprobs=seg.response_logprobs,
            response_versions=seg.response_versions,
            advantage=float(a),
            reward=c.reward,
            weight=1.0 / len(c.segments),
        )
        for c, a in zip(credits, adv.tolist(), strict=True)
        for seg in c.segments
    ]
    return samples, {**metrics, "samples": float(len(samples)), **counts}
