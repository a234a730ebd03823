"""Attention for the torch engine: grouped matmuls for one-token decode steps, SDPA otherwise.

torch's CPU SDPA is slow on a decode step's shapes: one query per row against a padded cache
in bf16 takes ~11 ms a layer at 48 rows x 350 keys here, and a padding mask also makes
transformers repeat the grouped keys and values for it (a copy of the whole cache per layer).
Two grouped matmuls do the same step in ~1.5 ms with no copy (the engine's decode speed on the
demo's shapes: ~65 -> ~150 tok/s). Prefills keep SDPA, which is as fast there.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["NAME", "grouped_decode_attention", "use_decode_attention"]

NAME = "agentrl_grouped_decode"
"""The attention implementation's registered name (its masks are SDPA's)."""


def grouped_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """Attention of ``(B, H, Q, D)`` queries over ``(B, KV, L, D)`` keys and values, each KV
    head serving ``H // KV`` query heads without repeating it. ``mask``: ``(B, 1, Q, L)``,
    boolean (True attends) or additive. Scores and softmax in float32. Returns ``(B, Q, H, D)``,
    the layout transformers' attention functions return."""
    batch, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    grouped = query.reshape(batch, key.shape[1], groups * length, dim)
    # The cache as the left operand: its rows are views of `RoomyLayer` buffers, which a
    # right operand's transpose would have copied first (~3x slower here).
    scores = torch.matmul(key, grouped.transpose(-1, -2)).transpose(-1, -2)  # (B, KV, G*Q, L)
    scores = scores.to(torch.float32, memory_format=torch.contiguous_format).mul_(scaling)
    scores = scores.view(batch, key.shape[1], groups, length, -1)  # (B, KV, G, Q, L)
    if mask is not None:
        mask = mask[:, :, None]  # (B, 1, 1, Q, L)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        else:
            scores = scores.add_(mask)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    weights = weights.view(batch, key.shape[1], groups * length, -1)
    out = torch.matmul(weights, value).view(batch, heads, length, dim)
    return out.transpose(1, 2).contiguous()


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if query.shape[2] != 1 or dropout or key.shape[1] == 0 or query.shape[1] % key.shape[1]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return grouped_decode_attention(query, key, value, attention_mask, scale), None


AttentionInterface.register(NAME, _attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_decode_attention(model: torch.nn.Module) -> None:
    """Serve ``model`` with `grouped_decode_attention` on decode steps, if it runs SDPA today
    (other implementations, e.g. eager or flash, are left as they are)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
