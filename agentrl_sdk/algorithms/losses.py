"""PPO clipped policy loss (DAPO clip-higher, dual-clip), token entropy and their configuration."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch import Tensor

from agentrl_sdk.algorithms.aggregation import LossAgg, aggregate
from agentrl_sdk.algorithms.corrections import OffPolicyCorrection
from agentrl_sdk.algorithms.estimators import EstimatorName
from agentrl_sdk.algorithms.kl import MAX_LOG_RATIO, KLKind
from agentrl_sdk.config import ConfigSection


class PolicyLossConfig(ConfigSection):
    """How the policy loss is computed: clipping, aggregation, KL and entropy terms."""

    advantage_estimator: EstimatorName = Field(
        "grpo", description="Advantage estimator: grpo, drgrpo (no std division) or rloo over "
        "each (row, policy) group's rewards; tree (Tree-GRPO, for rollout.tree): a leaf's grpo "
        "advantage in its group plus in its tree (algorithm.tree_levels: branch adds each "
        "deeper branch point's); or gae: PPO with a value model (the `critic:` section), "
        "per-token advantages over the sampled tokens (algorithm.gae)."
    )
    clip_low: float = Field(
        0.2, ge=0.0, lt=1.0, description="Ratio lower clip: ratio is clipped at 1 - clip_low."
    )
    clip_high: float = Field(
        0.28, ge=0.0, description="Ratio upper clip: 1 + clip_high (DAPO clip-higher: > clip_low)."
    )
    clip_c: float | None = Field(
        None, gt=1.0, description="Dual-clip bound for negative advantages: the loss of a token "
        "is at most -adv * clip_c (Ye et al. 2020); must be > 1. None disables it."
    )
    agg: LossAgg = Field(
        "token-mean", description="Loss aggregation: token-mean (DAPO), seq-mean-token-mean "
        "(GRPO), seq-mean-token-sum, seq-mean-token-sum-norm (Dr.GRPO, divides by padded T)."
    )
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the KL-to-reference loss; 0 = off.")
    kl_kind: KLKind = Field("k3", description="KL estimator of the KL loss: k1, k2 or k3.")
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Weight of the entropy bonus (subtracted from the loss); 0 = off."
    )
    correction: OffPolicyCorrection = Field(
        "none", description="Off-policy correction from the engine's recorded (behaviour) "
        "logprobs: none; tis (truncated importance sampling, as verl); decoupled (decoupled "
        "PPO, as AReaL). Both recompute proximal logprobs with the trainer's weights, clip the "
        "ratio against them and weight each token by pi_prox / pi_behav."
    )
    is_cap: float | None = Field(
        2.0, gt=0.0, description="tis: the importance weight is truncated at this value. "
        "decoupled: tokens whose weight exceeds it are left out (None keeps all)."
    )

    @model_validator(mode="after")
    def _cap_for_tis(self) -> PolicyLossConfig:
        if self.correction == "tis" and self.is_cap is None:
            raise ValueError("correction='tis' needs is_cap (the truncation threshold)")
        return self


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = None,
    agg: LossAgg = "token-mean",
    seq_weights: Tensor | None = None,
    entropy: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping and optional dual clip.

    ``ratio = exp(logp - logp_old)``;
    ``pg = max(-adv * ratio, -adv * clip(ratio, 1 - clip_low, 1 + clip_high))`` (DAPO
    clip-higher when ``clip_high > clip_low``); with ``clip_c``, ``pg = min(pg, -adv * clip_c)``
    where ``adv < 0`` (dual-clip PPO, as verl); with ``token_weights`` (off-policy importance
    weights, see `importance_weights`) ``pg = pg * token_weights``;
    ``loss = aggregate(pg, mask, agg, seq_weights)``.

    ``logp - logp_old`` is clamped to ``[-MAX_LOG_RATIO, MAX_LOG_RATIO]``; ``old_logprobs`` and
    ``advantages`` are constants (detached). Mask-0 tokens get exactly zero gradient.

    Metrics are means over trained tokens (sequence weights ignored): ``clip_frac`` (tokens
    where the clipped term won, ``-adv*clip(ratio) > -adv*ratio``), ``approx_kl`` (k3 estimate
    of ``KL(pi_old || pi)``: ``ratio - 1 - log ratio``), ``ratio_mean``, ``pg_loss`` (the
    loss), ``entropy`` when ``entropy`` is given, ``dual_clip_frac`` when ``clip_c`` is set.

    Args:
        logprobs: ``(B, T)`` log-probabilities of the sampled tokens under the current policy.
        old_logprobs: ``(B, T)`` the same under the behaviour policy (``logp_old``).
        advantages: ``(B, T)`` per token or ``(B,)`` per sequence (broadcast over ``T``).
        mask: ``(B, T)`` nonzero where a token is trained.
        clip_low: Lower clip range: ratio >= 1 - clip_low.
        clip_high: Upper clip range: ratio <= 1 + clip_high.
        clip_c: Dual-clip bound (> 1) for negative advantages; None disables it.
        agg: Aggregation mode (see :func:`~agentrl_sdk.algorithms.aggregation.aggregate`).
        seq_weights: ``(B,)`` sequence weights; all ones when None.
        entropy: ``(B, T)`` token entropies, only reported as a metric.
        token_weights: ``(B, T)`` constant per-token loss weights (detached); ones when None.

    Returns:
        ``(loss, metrics)``: the scalar loss and the metrics above.

    Raises:
        ValueError: ``clip_c`` is not above 1 or shapes disagree.
    """
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 for dual-clip PPO, got {clip_c}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must have the same (B, T) shape"
        )
    if advantages.shape not in (logprobs.shape, logprobs.shape[:1]):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be (B, T) or (B,) for logprobs "
            f"{tuple(logprobs.shape)}"
        )
    keep = mask.bool()  # (B, T)
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)
    # Masking the log-ratio first keeps padding (e.g. -inf logprobs) out of the gradient.
    log_ratio = torch.where(keep, logprobs - old_logprobs.detach(), 0.0)  # (B, T)
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)  # (B, T)
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    stats = {"clip_frac": pg_clipped > pg_unclipped}
    if clip_c is not None:
        pg_dual = -adv * clip_c  # (B, 1) or (B, T)
        dual = (adv < 0) & (pg > pg_dual)  # (B, T)
        pg = torch.where(dual, pg_dual, pg)
        stats["dual_clip_frac"] = dual
    if token_weights is not None:
        pg = pg * token_weights.detach().to(pg.dtype)
    loss = aggregate(pg, mask, agg, seq_weights)

    with torch.no_grad():
        stats |= {"approx_kl": ratio - 1.0 - log_ratio, "ratio_mean": ratio}
        if entropy is not None:
            stats["entropy"] = entropy
        means = [aggregate(v.to(pg.dtype).expand_as(pg), mask) for v in stats.values()]
        values = torch.stack([loss.detach(), *means]).tolist()  # one device sync
    return loss, {"pg_loss": values[0], **dict(zip(stats, values[1:], strict=True))}


def entropy_from_logits(logits: Tensor, chunk_size: int = 256) -> Tensor:
    """Entropy of the softmax of each row of logits, in ``chunk_size`` rows at a time.

    ``H = logsumexp(z) - sum_v softmax(z)_v z_v``; computed in at least float32. Chunking bounds
    the temporary ``(chunk_size, V)`` tensors when no gradient is needed; with autograd on, each
    chunk keeps its softmax for the backward pass. ``-inf`` logits (banned tokens) count as
    probability 0.

    Args:
        logits: ``(B, T, V)`` (any leading shape) unnormalised logits.
        chunk_size: Rows of ``V`` logits processed at once.

    Returns:
        ``(B, T)`` entropies in nats.
    """
    z = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    parts = []
    for chunk in z.split(chunk_size):
        chunk = chunk.to(dtype).clamp_min(torch.finfo(dtype).min)  # -inf -> finite, p stays 0
        lse = torch.logsumexp(chunk, dim=-1, keepdim=True)  # (n, 1)
        p = torch.exp(chunk - lse)  # (n, V)
        parts.append(lse.squeeze(-1) - (p * chunk).sum(-1))  # (n,)
    return torch.cat(parts).reshape(logits.shape[:-1])
