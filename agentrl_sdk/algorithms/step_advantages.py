"""Step-level advantages: discounted returns over a rollout's LLM calls, against a group
baseline or (GiGPO) within groups of calls from equal anchor states."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

from agentrl_sdk.algorithms.advantages import GroupIds, _group, compute_advantages

StepBaseline = Literal["grpo", "drgrpo", "rloo"]
"""How the group baseline (and scale) of `compute_step_advantages` is taken."""


def discounted_returns(rewards: Tensor, rollout: Tensor, gamma: float) -> Tensor:
    """``G_k = r_k + gamma * G_{k+1}`` within each rollout (0 after its last call).

    Args:
        rewards: ``(M,)`` one reward per LLM call.
        rollout: ``(M,)`` the rollout of each call; a rollout's calls are contiguous, in order.
        gamma: The discount per call.

    Returns:
        ``(M,)`` the return of every call.
    """
    returns = torch.empty_like(rewards)  # (M,)
    running = rewards.new_zeros(())
    for k in range(rewards.numel() - 1, -1, -1):
        if k == rewards.numel() - 1 or rollout[k + 1] != rollout[k]:
            running = rewards.new_zeros(())  # the rollout's last call
        running = rewards[k] + gamma * running
        returns[k] = running
    return returns


def compute_step_advantages(
    rewards: Tensor,
    rollout: Tensor,
    group_ids: GroupIds,
    gamma: float = 1.0,
    baseline: StepBaseline = "grpo",
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """Per-call advantages: each call's return against its group's rollout returns.

    ``adv_k = (G_k - b_i) / s_i`` for call ``k`` of rollout ``i``, with ``G_k`` its discounted
    return (`discounted_returns`) and ``G_i = G_{first call of i}`` the rollout's return.
    ``b_i`` is the mean of ``G`` over the rollouts of ``i``'s group (``grpo``, ``drgrpo``) or
    over the others (``rloo``); ``s_i`` is the group's unbiased std of ``G`` plus ``eps``
    for ``grpo`` (1 when that std is 0, so rewards earned by single calls still count), else 1.
    With ``gamma = 1`` and only a last-call reward these are the rollout-level estimator's
    advantages (to rounding).
    Groups of one rollout get advantage 0.

    Args:
        rewards: ``(M,)`` one reward per call (a rollout's outcome added to its last call).
        rollout: ``(M,)`` rollout index of each call in ``[0, N)``; contiguous, in call order.
        group_ids: ``N`` hashable group keys, one per rollout.
        gamma: Discount per call.
        baseline: ``grpo``, ``drgrpo`` or ``rloo``.
        eps: Added to the std before dividing (``grpo``).

    Returns:
        ``(adv, metrics)``: ``adv`` ``(M,)``; ``step_adv_mean``, ``step_adv_std``,
        ``step_return_mean``.
    """
    if rewards.dim() != 1 or rollout.shape != rewards.shape:
        raise ValueError(f"rewards and rollout must both have shape (M,), got "
                         f"{tuple(rewards.shape)} and {tuple(rollout.shape)}")
    returns = discounted_returns(rewards.to(torch.float64), rollout, gamma)  # (M,)
    first = torch.ones_like(rollout, dtype=torch.bool)  # (M,)
    first[1:] = rollout[1:] != rollout[:-1]
    g = _group(returns[first], group_ids)  # per rollout (N,)
    n = g.count[g.index]  # (N,)
    if baseline == "rloo":
        base = (g.total[g.index] - g.r) / (n - 1).clamp_min(1)  # (N,) leave-one-out mean
    else:
        base = (g.total / g.count)[g.index]  # (N,)
    scale = torch.ones_like(base)  # (N,)
    if baseline == "grpo":
        dev = g.r - base
        sq = torch.zeros_like(g.total).index_add(0, g.index, dev.square())  # (G,)
        std = (sq / (g.count - 1).clamp_min(1)).sqrt()[g.index]  # (N,) unbiased
        scale = torch.where(std > 0, std + eps, scale)
    adv = (returns - base[rollout]) / scale[rollout]  # (M,)
    adv = torch.where(n[rollout] > 1, adv, torch.zeros_like(adv))
    metrics = {
        "step_adv_mean": adv.mean().item() if adv.numel() else 0.0,
        "step_adv_std": adv.std(correction=0).item() if adv.numel() else 0.0,
        "step_return_mean": returns.mean().item() if returns.numel() else 0.0,
    }
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float64), metrics


def compute_anchor_advantages(
    rewards: Tensor,
    rollout: Tensor,
    group_ids: Sequence[Hashable],
    anchor_ids: Sequence[Hashable],
    gamma: float = 1.0,
    baseline: StepBaseline = "grpo",
    omega: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """GiGPO-style advantages (Feng et al., arXiv:2505.10978): episode plus anchor-step groups.

    ``adv_k = A_E(i) + omega * A_S(k)``: ``A_E`` is the ``baseline`` estimator over the
    rollouts' total rewards ``sum_k r_k`` within their group; ``A_S`` the same estimator over
    the calls' discounted returns ``G_k`` within the step group of calls that share their
    rollout group and their anchor state (``anchor_ids``: equal observations). A step group of
    one call (or of equal returns) adds nothing.

    Args:
        rewards: ``(M,)`` one reward per call.
        rollout: ``(M,)`` rollout index of each call in ``[0, N)``; contiguous, in call order.
        group_ids: ``N`` group keys, one per rollout.
        anchor_ids: ``M`` anchor-state keys, one per call.
        gamma: Discount per call.
        baseline: ``grpo``, ``drgrpo`` or ``rloo``, for both levels.
        omega: Weight of the step-level advantage.

    Returns:
        ``(adv, metrics)``: ``adv`` ``(M,)``; ``step_adv_mean``, ``step_adv_std``,
        ``step_groups``, ``step_group_size_mean``.
    """
    r = rewards.to(torch.float64)
    returns = discounted_returns(r, rollout, gamma)  # (M,)
    totals = r.new_zeros(len(group_ids)).index_add(0, rollout, r)  # (N,)
    episode, _ = compute_advantages(baseline, totals, group_ids)  # (N,)
    step_keys = [(group_ids[i], a) for i, a in zip(rollout.tolist(), anchor_ids, strict=True)]
    step, step_metrics = compute_advantages(baseline, returns, step_keys)  # (M,)
    adv = episode[rollout] + omega * step  # (M,)
    groups = step_metrics["adv_groups"]
    return adv, {
        "step_adv_mean": adv.mean().item() if adv.numel() else 0.0,
        "step_adv_std": adv.std(correction=0).item() if adv.numel() else 0.0,
        "step_groups": groups,
        "step_group_size_mean": adv.numel() / groups if groups else 0.0,
    }
