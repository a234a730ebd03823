"""Attention for the torch engine: grouped matmuls for one-token decode steps, SDPA otherwise.

torch's CPU SDPA is slow on a decode step's shapes: one query per row against a padded cache
in bf16 takes ~11 ms a layer at 48 rows x 350 keys here, and a padding mask also makes
transformers repeat the grouped keys and values for it (a copy of the whole cache per layer).
Two grouped matmuls do the same step in ~1.5 ms with no copy (the engine's decode speed on the
demo's shapes: ~65 -> ~200 tok/s). Prefills are the other way round: SDPA's flash kernel works
in blocks, without the ``(B, H, Q, L)`` float32 scores a grouped product writes and softmaxes,
and takes a tenth of its time at 6 prompts x 330 tokens (4 against 30 ms a layer, bf16).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from agentrl_sdk.engines.torch.kv_cache import room_of
from agentrl_sdk.engines.torch.shared_prompts import attend_with_shared_prompts, current_prompts

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
    if mask is None and length > 1:  # no padding: transformers left the causal rule to us
        mask = torch.ones(length, key.shape[2], dtype=torch.bool, device=query.device)
        mask = mask.tril(key.shape[2] - length)[None, None]  # (1, 1, Q, L)
    if mask is not None:
        mask = mask[:, :, None]  # (B, 1, 1, Q, L)
        if mask.dtype == torch.bool:  # the lowest float, not -inf: a left-padded prefill's
            # padding queries see nothing, and -inf would make their outputs (and the keys
            # and values later layers cache for them) NaN; SDPA keeps them finite too
            scores = scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
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
    batch, heads, length, _ = query.shape
    grouped = key.shape[1] > 0 and heads % key.shape[1] == 0
    prompts = current_prompts() if length == 1 else None
    if prompts is not None and (not grouped or dropout):  # SDPA would not see the prompts
        raise ValueError("shared prompts need grouped query heads and no dropout")
    if prompts is None and (length > 1 or not grouped or dropout):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    key_room, value_room = room_of(key), room_of(value)
    if length == 1 and key_room is not None and value_room is not None:
        # A decode step over the cache's whole buffers: the columns after the cached ones
        # are zeros, masked out, and a matmul copies a view with room before using it.
        cached, width = key.shape[2], key_room.shape[2]
        if attention_mask is None:
            attention_mask = torch.ones(batch, 1, 1, cached, dtype=torch.bool)
        floating = attention_mask.is_floating_point()
        padding = torch.finfo(attention_mask.dtype).min if floating else False
        attention_mask = F.pad(attention_mask, (0, width - cached), value=padding)
        key, value = key_room, value_room
    if prompts is not None:  # a decode step of rows whose group prompts are stored once
        if attention_mask is None:
            attention_mask = torch.ones(batch, 1, 1, key.shape[2], dtype=torch.bool)
        out = attend_with_shared_prompts(
            query, key, value, attention_mask, scale, prompts, module.layer_idx
        )
        return out, None
    return grouped_decode_attention(query, key, value, attention_mask, scale), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Serve ``model`` with `grouped_decode_attention` on decode steps, if it runs SDPA today
    (other implementations, e.g. eager or flash, are left as they are); whether it does."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        # Imported here, not at the top: transformers' modeling_utils probes for mlflow, which
        # must first be imported with telemetry off (the CLI sets that switch itself).
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
        model.set_attn_implementation(NAME)
    return getattr(config, "_attn_implementation", None) == NAME
