"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO) over one outcome reward per rollout."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

AdvantageEstimator = Literal["grpo", "drgrpo", "rloo"]
"""The group baselines: GRPO, Dr.GRPO (GRPO without std division) and RLOO; each is also an
entry of `agentrl_sdk.algorithms.estimators.ESTIMATORS`, which is built from these names."""

GroupIds = Sequence[Hashable] | Tensor
"""One group key per rollout (e.g. ``(row_id, policy)``), or a 1-D tensor of keys."""


class _Groups(NamedTuple):
    """Per-group statistics of the rewards; ``index`` maps each rollout to its group."""

    r: Tensor  # (N,) rewards as floats
    index: Tensor  # (N,) group of each rollout, in [0, G)
    count: Tensor  # (G,) rollouts per group
    total: Tensor  # (G,) sum of rewards per group
    flat: Tensor  # (G,) True where all rewards of the group are equal (singletons included)


def _group(rewards: Tensor, group_ids: GroupIds) -> _Groups:
    """Validates the inputs and gathers the per-group sums the estimators need."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (N,), got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"rewards must be finite; rows {bad} are not (score or drop them first)")
    if len(group_ids) != rewards.numel():
        raise ValueError(
            f"group_ids has {len(group_ids)} entries but rewards has {rewards.numel()}"
        )
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if isinstance(group_ids, Tensor):
        keys, index = torch.unique(group_ids.to(r.device), dim=0, return_inverse=True)
        num_groups = keys.shape[0]
    else:
        first: dict[Hashable, int] = {}
        index = torch.tensor(
            [first.setdefault(g, len(first)) for g in group_ids], dtype=torch.long, device=r.device
        )
        num_groups = len(first)
    zeros = r.new_zeros(num_groups)  # (G,)
    count = zeros.index_add(0, index, torch.ones_like(r))
    total = zeros.index_add(0, index, r)
    lo = zeros.scatter_reduce(0, index, r, "amin", include_self=False)
    hi = zeros.scatter_reduce(0, index, r, "amax", include_self=False)
    return _Groups(r, index, count, total, flat=lo == hi)


def _baseline(g: _Groups, leave_one_out: bool = False) -> Tensor:
    """``(N,)`` the mean reward of each rollout's group, or of the others in it (RLOO)."""
    if leave_one_out:
        return (g.total[g.index] - g.r) / (g.count[g.index] - 1).clamp_min(1)
    return (g.total / g.count)[g.index]


def _std(g: _Groups, dev: Tensor) -> Tensor:
    """``(G,)`` each group's unbiased std, from the ``(N,)`` deviations from its mean."""
    sq = torch.zeros_like(g.total).index_add(0, g.index, dev.square())
    return (sq / (g.count - 1).clamp_min(1)).sqrt()


def _finish(adv: Tensor, groups: _Groups) -> tuple[Tensor, dict[str, float]]:
    """Zeroes the advantages of flat groups exactly and summarises the result."""
    # Floating-point means of equal rewards can miss them by an ulp; a flat group has no signal.
    adv = torch.where(groups.flat[groups.index], torch.zeros_like(adv), adv)  # (N,)
    num_groups = groups.count.numel()
    metrics = {
        "adv_mean": adv.mean().item() if adv.numel() else 0.0,
        "adv_std": adv.std(correction=0).item() if adv.numel() else 0.0,
        "adv_groups": float(num_groups),
        "adv_zero_std_group_frac": groups.flat.float().mean().item() if num_groups else 0.0,
    }
    return adv, metrics


def compute_grpo_advantages(
    rewards: Tensor,
    group_ids: GroupIds,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO advantages: each reward standardised within its group.

    ``adv_i = (r_i - mean_g) / (std_g + eps)`` with the unbiased group std (as verl does), or
    ``adv_i = r_i - mean_g`` when ``norm_by_std`` is False (Dr.GRPO, arXiv:2503.20783). Groups of
    one rollout and groups whose rewards are all equal get advantage exactly 0.

    Args:
        rewards: ``(N,)`` one outcome reward per rollout.
        group_ids: ``N`` hashable group keys (rollouts of one prompt share a key).
        norm_by_std: Divide by the group std (GRPO) or only centre (Dr.GRPO).
        eps: Added to the std before dividing.

    Returns:
        ``(adv, metrics)``: ``adv`` ``(N,)`` in the rewards' float dtype, and ``adv_mean``,
        ``adv_std`` (population std), ``adv_groups`` and ``adv_zero_std_group_frac`` (share of
        groups whose rewards are all equal, singletons included).
    """
    g = _group(rewards, group_ids)
    dev = g.r - _baseline(g)  # (N,)
    return _finish(dev / (_std(g, dev)[g.index] + eps) if norm_by_std else dev, g)


def compute_rloo_advantages(
    rewards: Tensor, group_ids: GroupIds
) -> tuple[Tensor, dict[str, float]]:
    """RLOO advantages: each reward minus the mean of the other rewards of its group.

    ``adv_i = r_i - (sum_{j in g} r_j - r_i) / (n_g - 1)`` (Ahmadian et al., arXiv:2402.14740).
    Groups of one rollout and groups whose rewards are all equal get advantage exactly 0.
    Arguments and ``(adv, metrics)`` as in :func:`compute_grpo_advantages`.
    """
    g = _group(rewards, group_ids)
    return _finish(g.r - _baseline(g, leave_one_out=True), g)
