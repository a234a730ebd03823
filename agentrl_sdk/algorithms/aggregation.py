"""Reduction of a per-token loss matrix to one scalar, shared by every loss of the package."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Literal, TypeVar

import numpy as np
import torch
from torch import Tensor

LossAgg = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
"""How a ``(B, T)`` loss matrix becomes a scalar; verl's ``loss_agg_mode`` names."""


_Key = TypeVar("_Key", bound=Hashable)


def sequence_mass(weight: float | np.ndarray, trained_tokens: float | np.ndarray, agg: LossAgg):
    """A sequence's part of the denominator of `aggregate` (element-wise on arrays).

    ``weight × trained tokens`` under ``token-mean``; under the seq-mean modes ``weight`` if
    the sequence has a trained token, else 0. Summed over a batch it is the denominator; a
    micro-batch's sum over the batch's is its share of the loss; a rollout's sum over the
    batch's is its share of the update.
    """
    _check_agg(agg)
    if agg == "token-mean":
        return weight * trained_tokens
    return weight * (np.asarray(trained_tokens) > 0)


def loss_shares(masses: Mapping[_Key, float]) -> dict[_Key, float]:
    """Each key's share of the total `sequence_mass` (shares sum to 1; all 0 if nothing trains)."""
    total = sum(masses.values()) or 1.0
    return {key: float(mass) / total for key, mass in masses.items()}


def micro_batch_share(
    mass: float, total_mass: float, agg: LossAgg, length: int = 1, longest: int = 1
) -> float:
    """The factor a micro-batch's own `aggregate` loss is scaled by so that the micro-batches'
    scaled losses add up to the whole batch's loss (and their gradients to its gradient).

    ``M_mb / M``, with ``M_mb`` and ``M`` the micro-batch's and the batch's summed
    `sequence_mass` (0 if ``M`` is 0). Under ``seq-mean-token-sum-norm`` also ``× T_mb / T``: the
    micro-batch divided its token sums by its own padded ``length`` ``T_mb``, the batch by its
    ``longest`` response ``T``.
    """
    share = mass / total_mass if total_mass else 0.0
    if agg == "seq-mean-token-sum-norm":
        share *= length / longest
    return share


def token_share(tokens: float, total_tokens: float) -> float:
    """A micro-batch's weight in the token means of a batch: ``n_mb / n`` (0 if ``n`` is 0)."""
    return tokens / total_tokens if total_tokens else 0.0


def _check_agg(agg: str) -> None:
    if agg != "token-mean" and agg not in _SEQ_LOSS:
        raise ValueError(f"unknown agg {agg!r}; choose one of {['token-mean', *_SEQ_LOSS]}")


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den``, and 0 where ``den`` is 0 (there ``num`` is 0 too, so no gradient is lost)."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


# Per-sequence loss from (token sum (B,), trained tokens (B,), padded length T).
_SEQ_LOSS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "seq-mean-token-sum": lambda tok_sum, n_tok, T: tok_sum,
    "seq-mean-token-mean": lambda tok_sum, n_tok, T: _safe_div(tok_sum, n_tok),
    "seq-mean-token-sum-norm": lambda tok_sum, n_tok, T: tok_sum / T,
}


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    agg: LossAgg = "token-mean",
    seq_weights: Tensor | None = None,
) -> Tensor:
    """Aggregates a per-token loss over the trained tokens.

    With ``m_it`` the mask, ``l_it`` the loss and ``w_i`` the sequence weights (default 1):

    - ``token-mean``: ``sum_it w_i m_it l_it / sum_it w_i m_it`` (DAPO).
    - seq-mean modes: ``sum_i w_i s_i / sum_i w_i`` over sequences with a trained token, where
      ``s_i`` is ``sum_t m_it l_it`` (``seq-mean-token-sum``), ``sum_t m_it l_it / sum_t m_it``
      (``seq-mean-token-mean``, GRPO) or ``sum_t m_it l_it / T`` (``seq-mean-token-sum-norm``,
      Dr.GRPO; ``T`` is the padded length ``loss_mat.shape[-1]``).

    Positions with mask 0 get exactly zero gradient, even where ``loss_mat`` is inf or nan; a
    batch without trained tokens gives 0. Unlike older verl, ``seq-mean-token-sum-norm`` is a
    mean over sequences (it does not grow with ``B``), like the other seq-mean modes.

    Args:
        loss_mat: ``(B, T)`` per-token loss.
        mask: ``(B, T)`` nonzero where a token is trained.
        agg: Aggregation mode.
        seq_weights: ``(B,)`` non-negative weight of each sequence (e.g. its share of a
            rollout); all ones when None.

    Returns:
        The scalar loss.

    Raises:
        ValueError: Shapes disagree or ``agg`` is unknown.
    """
    if mask.shape != loss_mat.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be (B, T)"
        )
    _check_agg(agg)
    keep = mask.bool()  # (B, T)
    B, T = loss_mat.shape
    if seq_weights is None:
        w = loss_mat.new_ones(B)  # (B,)
    elif seq_weights.shape != (B,):
        raise ValueError(f"seq_weights must have shape ({B},), got {tuple(seq_weights.shape)}")
    else:
        w = seq_weights.detach().to(loss_mat.dtype)  # (B,)
    tok_sum = torch.where(keep, loss_mat, 0.0).sum(-1)  # (B,)
    n_tok = keep.sum(-1).to(loss_mat.dtype)  # (B,)
    if agg == "token-mean":
        return _safe_div((w * tok_sum).sum(), (w * n_tok).sum())
    seq_loss = _SEQ_LOSS[agg](tok_sum, n_tok, T)  # (B,)
    w = torch.where(n_tok > 0, w, 0.0)  # sequences without trained tokens do not count
    return _safe_div((w * seq_loss).sum(), w.sum())
