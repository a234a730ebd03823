"""Trajectories -> training samples: group advantages per (row, policy), per-rollout weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl_sdk.algorithms import compute_advantages
from agentrl_sdk.types import Sample, Trajectory


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    estimator: str = "grpo",
    policies: Sequence[str] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """One sample per trained segment of every scored trajectory.

    Advantages are computed over the rollouts of the same dataset row and policy; every
    segment of a rollout gets that rollout's advantage and a ``weight`` of
    ``1 / (its trained segments for that policy)``, so each rollout counts once.

    Args:
        trajectories: Rollouts with ``reward`` set; those with ``reward`` None are skipped.
        estimator: Advantage estimator name (``grpo``, ``drgrpo``, ``rloo``).
        policies: Policies to build samples for; all when None.

    Returns:
        The samples and metrics (``samples``, ``rollouts_skipped``, advantage statistics).
    """
    entries = []  # (trajectory, policy, its trained segments)
    skipped = 0
    for traj in trajectories:
        if traj.reward is None:
            skipped += 1
            continue
        by_policy: dict[str, list] = {}
        for seg in traj.trained_segments:
            if policies is None or seg.policy in policies:
                by_policy.setdefault(seg.policy, []).append(seg)
        entries += [(traj, policy, segs) for policy, segs in by_policy.items()]
    if not entries:
        return [], {"samples": 0.0, "rollouts_skipped": float(skipped)}

    rewards = torch.tensor([t.reward for t, _, _ in entries], dtype=torch.float64)
    groups = [(t.row_id, p) for t, p, _ in entries]
    adv, metrics = compute_advantages(estimator, rewards, groups)
    samples = [
        Sample(
            row_id=traj.row_id,
            sample_index=traj.sample_index,
            policy=policy,
            node=seg.node,
            prompt_ids=seg.prompt_ids,
            response_ids=seg.response_ids,
            response_mask=seg.response_mask,
            old_logprobs=seg.response_logprobs,
            response_versions=seg.response_versions,
            advantage=float(a),
            reward=float(traj.reward),
            weight=1.0 / len(segs),
        )
        for (traj, policy, segs), a in zip(entries, adv.tolist(), strict=True)
        for seg in segs
    ]
    return samples, {
        **metrics,
        "samples": float(len(samples)),
        "rollouts_skipped": float(skipped),
    }
