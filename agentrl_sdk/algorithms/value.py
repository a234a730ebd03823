"""PPO with a value model: GAE over mask-1 tokens, the clipped value loss, explained variance."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from agentrl_sdk.algorithms.aggregation import LossAgg, aggregate
from agentrl_sdk.config import ConfigSection

__all__ = [
    "ValueLossConfig",
    "compute_gae",
    "explained_variance",
    "masked_whiten",
    "value_loss",
]


class ValueLossConfig(ConfigSection):
    """How the critic's loss is computed (what the value workers get)."""

    cliprange_value: float = Field(
        0.5, gt=0.0, description="Value clipping: a new value counts at most this far from "
        "the value the batch was scored with (verl's critic.cliprange_value)."
    )
    agg: LossAgg = Field(
        "token-mean", description="Aggregation of the per-token value loss (as algorithm.agg)."
    )


def _check(mask: Tensor, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != mask.shape or t.dim() != 2:
            raise ValueError(f"{name} {tuple(t.shape)} and mask {tuple(mask.shape)} must both "
                             "be (B, T)")


def compute_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the mask-1 (sampled) tokens of each sequence.

    The sampled tokens form the time axis; observation tokens (mask 0: tool results, user
    turns) are skipped: they get no reward and no TD step, and the value of the next sampled
    token passes through them. With ``t'`` the next mask-1 token after ``t`` (none after the
    last one), the terminal reward ``r`` on the last mask-1 token ``t_end``:

    ``delta_t = [t = t_end] r + gamma V_{t'} - V_t`` (``V_{t'} = 0`` after ``t_end``);
    ``A_t = delta_t + gamma lam A_{t'}``; ``R_t = A_t + V_t`` (Schulman et al. 2016, as verl's
    multi-turn GAE). Mask-0 positions get ``A = R = 0``.

    Args:
        rewards: ``(B,)`` each sequence's terminal reward.
        values: ``(B, T)`` the critic's value of the state before each response token.
        mask: ``(B, T)`` nonzero at sampled (trained) tokens.
        gamma: Discount per sampled token.
        lam: GAE lambda (1: Monte-Carlo returns; 0: one-step TD).

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in the values' float dtype.
    """
    _check(mask, values=values)
    if rewards.shape != values.shape[:1]:
        raise ValueError(f"rewards must be ({values.shape[0]},), got {tuple(rewards.shape)}")
    keep = mask.bool()  # (B, T)
    v = values.detach().float()
    B, T = v.shape
    has_token = keep.any(-1)  # (B,)
    last = T - 1 - keep.flip(-1).int().argmax(-1)  # (B,) the last mask-1 token
    r = torch.zeros_like(v)  # (B, T) token rewards
    rows = torch.nonzero(has_token).flatten()
    r[rows, last[rows]] = rewards.detach().float()[rows]
    adv = torch.zeros_like(v)  # (B, T)
    next_v = v.new_zeros(B)  # V_{t'}
    next_adv = v.new_zeros(B)  # A_{t'}
    for t in reversed(range(T)):
        m = keep[:, t]  # (B,)
        delta = r[:, t] + gamma * next_v - v[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, 0.0)
        next_v = torch.where(m, v[:, t], next_v)
        next_adv = torch.where(m, a, next_adv)
    returns = torch.where(keep, adv + v, 0.0)
    return adv.to(values.dtype), returns.to(values.dtype)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the mask-1 entries (unbiased var, as verl);
    0 at mask 0. Fewer than two entries: only centred."""
    keep = mask.bool()
    vals = x[keep]
    if vals.numel() == 0:
        return torch.zeros_like(x)
    mean = vals.mean()
    if vals.numel() < 2:
        return torch.where(keep, x - mean, 0.0)
    return torch.where(keep, (x - mean) * torch.rsqrt(vals.var() + eps), 0.0)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    cliprange_value: float = 0.5,
    agg: LossAgg = "token-mean",
    seq_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss (verl's ``compute_value_loss``).

    ``V_clip = V_old + clip(V - V_old, -c, c)``;
    ``l = 0.5 * max((V - R)^2, (V_clip - R)^2)``; ``loss = aggregate(l, mask, agg, seq_weights)``.

    Metrics: ``value_loss`` (the loss), ``clip_fraction`` (mask-1 tokens where the clipped
    term won) and ``values_mean`` (mean ``V`` over mask-1 tokens).

    Args:
        values: ``(B, T)`` the critic's current values ``V`` (with gradient).
        old_values: ``(B, T)`` the values the batch was scored with ``V_old``.
        returns: ``(B, T)`` GAE returns ``R``.
        mask: ``(B, T)`` nonzero at trained tokens.
        cliprange_value: ``c``.
        agg: Aggregation mode.
        seq_weights: ``(B,)`` sequence weights; ones when None.

    Returns:
        ``(loss, metrics)``.
    """
    _check(mask, values=values, old_values=old_values, returns=returns)
    old, ret = old_values.detach().to(values.dtype), returns.detach().to(values.dtype)
    clipped = old + (values - old).clamp(-cliprange_value, cliprange_value)  # (B, T)
    l_unclipped = (values - ret).square()  # (B, T)
    l_clipped = (clipped - ret).square()  # (B, T)
    loss_mat = 0.5 * torch.maximum(l_unclipped, l_clipped)
    loss = aggregate(loss_mat, mask, agg, seq_weights)
    with torch.no_grad():
        frac = aggregate((l_clipped > l_unclipped).to(values.dtype), mask)
        mean = aggregate(values.detach(), mask)
        stats = torch.stack([loss.detach(), frac, mean]).tolist()
    return loss, dict(zip(("value_loss", "clip_fraction", "values_mean"), stats, strict=True))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over mask-1 tokens (population variances): 1 when the
    values predict the returns exactly, 0 for a constant guess at their mean, negative when
    worse. ``nan`` when the returns do not vary (nothing to explain) or no token is masked in.
    """
    _check(mask, values=values, returns=returns)
    keep = mask.bool()
    v, ret = values.detach().double()[keep], returns.detach().double()[keep]
    if ret.numel() == 0:
        return float("nan")
    var_r = ret.var(correction=0)
    if var_r <= 1e-12:
        return float("nan")
    return float(1.0 - (ret - v).var(correction=0) / var_r)
