"""Off-policy corrections: importance weights from the behaviour policy to the proximal policy.

Asynchronous training samples tokens with weights that are one or more updates old (the
*behaviour* policy, whose logprobs the engine recorded) and may sample with an engine whose
numerics differ from the trainer's. Both corrections recompute the *proximal* logprobs
``logp_prox`` with the trainer's current weights before the first optimizer step, clip the
PPO ratio ``pi_theta / pi_prox`` as usual, and weight each token's loss by
``w = pi_prox / pi_behav``:

- ``tis`` (truncated importance sampling, Yao et al. 2025 as in verl): ``w = min(w, cap)``.
- ``decoupled`` (decoupled PPO, Hilton et al. 2022 as in AReaL): ``w`` as it is; with a
  ``cap``, tokens whose weight exceeds it are left out of the loss (``w = 0``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from agentrl_sdk.algorithms.kl import MAX_LOG_RATIO

OffPolicyCorrection = Literal["none", "tis", "decoupled"]


def importance_weights(
    logp_prox: Tensor,
    logp_behav: Tensor,
    mask: Tensor,
    correction: OffPolicyCorrection = "tis",
    cap: float | None = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token weights ``pi_prox / pi_behav`` for the policy loss, and mismatch metrics.

    ``w = exp(logp_prox - logp_behav)`` (log-ratio clamped to ``±MAX_LOG_RATIO``); ``tis``
    truncates ``w`` at ``cap``, ``decoupled`` zeroes the tokens with ``w > cap``; ``none``
    gives ones (metrics still report the mismatch). Mask-0 tokens get weight 0.

    Metrics are means over the trained tokens: ``is_weight_mean`` / ``_min`` / ``_max`` (of
    the raw weights), ``is_capped_frac`` (tokens truncated or dropped), ``mismatch_kl`` (k3
    estimate of ``KL(pi_behav || pi_prox)``: ``w - 1 - log w``, the behaviour policy sampled
    the tokens) and ``mismatch_abs_logp`` (mean ``|logp_prox - logp_behav|``).

    Args:
        logp_prox: Logprobs of the sampled tokens under the trainer's weights, any shape.
        logp_behav: The same under the policy that sampled them (recorded by the engine).
        mask: Nonzero where a token is trained; same shape.
        correction: ``none``, ``tis`` or ``decoupled``.
        cap: ``tis``: truncation threshold (required). ``decoupled``: tokens above it are
            dropped; None keeps all.

    Returns:
        ``(weights, metrics)``; the weights are detached, float32, shaped like ``mask``.

    Raises:
        ValueError: Shapes differ, ``tis`` without a cap, or a cap that is not positive.
    """
    if logp_prox.shape != logp_behav.shape or logp_prox.shape != mask.shape:
        raise ValueError(
            f"logp_prox {tuple(logp_prox.shape)}, logp_behav {tuple(logp_behav.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape"
        )
    if correction == "tis" and cap is None:
        raise ValueError("correction='tis' needs a cap (the truncation threshold)")
    if cap is not None and cap <= 0:
        raise ValueError(f"cap must be positive, got {cap}")
    with torch.no_grad():
        keep = mask.bool()
        log_w = torch.where(keep, logp_prox.float() - logp_behav.float(), 0.0)
        log_w = log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        w = torch.exp(log_w)  # raw pi_prox / pi_behav; 1 at mask-0
        capped = keep & (w > cap) if cap is not None else torch.zeros_like(keep)
        if correction == "none":
            weights = torch.ones_like(w)
        elif correction == "tis":
            weights = w.clamp(max=cap)
        elif correction == "decoupled":
            weights = torch.where(capped, 0.0, w)
        else:
            raise ValueError(f"unknown correction {correction!r}: none, tis or decoupled")
        weights = torch.where(keep, weights, 0.0)
        n = int(keep.sum())
        if n == 0:
            return weights, dict.fromkeys(_METRICS, 0.0)
        kept = w[keep]
        metrics = {
            "is_weight_mean": kept.mean(),
            "is_weight_min": kept.min(),
            "is_weight_max": kept.max(),
            "is_capped_frac": capped.sum() / n,
            "mismatch_kl": (kept - 1.0 - log_w[keep]).mean(),
            "mismatch_abs_logp": log_w[keep].abs().mean(),
        }
        values = torch.stack(list(metrics.values())).tolist()
    return weights, dict(zip(metrics, values, strict=True))


_METRICS = (
    "is_weight_mean", "is_weight_min", "is_weight_max", "is_capped_frac", "mismatch_kl",
    "mismatch_abs_logp",
)  # fmt: skip
