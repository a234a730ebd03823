"""KL divergence to a reference policy: Schulman's per-token estimators and the aggregated loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from agentrl_sdk.algorithms.aggregation import LossAgg, aggregate

KLKind = Literal["k1", "k2", "k3"]
"""Schulman's KL estimators (http://joschu.net/blog/kl-approx.html)."""

MAX_LOG_RATIO = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp`` (as verl does): ``e^20`` is finite."""

# Estimators of KL(pi || pi_ref) from log_r = log pi_ref - log pi at tokens sampled from pi.
_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda log_r: -log_r,
    "k2": lambda log_r: 0.5 * log_r.square(),
    "k3": lambda log_r: torch.exp(log_r) - log_r - 1.0,
}


def _kl_from_log_ratio(log_r: Tensor, kind: KLKind) -> Tensor:
    if kind not in _ESTIMATORS:
        raise ValueError(f"unknown KL kind {kind!r}; choose one of {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[kind](log_r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` at tokens sampled from ``pi``.

    With ``log_r = ref_logp - logp``: ``k1 = -log_r`` (unbiased, high variance),
    ``k2 = log_r^2 / 2`` (biased, low variance), ``k3 = exp(log_r) - log_r - 1`` (unbiased,
    low variance, never negative). ``log_r`` is clamped to ``[-MAX_LOG_RATIO, MAX_LOG_RATIO]``.

    Args:
        logprobs: ``(B, T)`` log-probabilities of the sampled tokens under the policy.
        ref_logprobs: ``(B, T)`` the same under the reference policy (no gradient flows to it).
        kind: Which estimator.

    Returns:
        ``(B, T)`` per-token KL estimate.
    """
    return _kl_from_log_ratio(ref_logprobs.detach() - logprobs, kind)


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kind: KLKind = "k3",
    agg: LossAgg = "token-mean",
    seq_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KL-to-reference loss: :func:`kl_penalty` aggregated like the policy loss.

    ``loss = aggregate(kl_penalty(logp, logp_ref, kind), mask, agg, seq_weights)``.

    Args:
        logprobs: ``(B, T)`` log-probabilities of the sampled tokens under the policy.
        ref_logprobs: ``(B, T)`` the same under the reference policy.
        mask: ``(B, T)`` nonzero where a token is trained; mask-0 tokens get zero gradient.
        kind: Which estimator (see :func:`kl_penalty`).
        agg: Aggregation mode (see :func:`~agentrl_sdk.algorithms.aggregation.aggregate`).
        seq_weights: ``(B,)`` sequence weights; all ones when None.

    Returns:
        ``(loss, metrics)`` with metric ``kl`` (the loss value).
    """
    # Masking the log-ratio first keeps padding (e.g. -inf logprobs) out of the gradient.
    log_r = torch.where(mask.bool(), ref_logprobs.detach() - logprobs, 0.0)  # (B, T)
    loss = aggregate(_kl_from_log_ratio(log_r, kind), mask, agg, seq_weights)
    return loss, {"kl": loss.item()}
