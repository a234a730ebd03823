"""How a policy's layers are prepared for training: which train, in which dtype the frozen ones
are kept, which recompute their activations in the backward pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["checkpoint_activations", "freeze_all_but_last", "store_frozen_in"]


def freeze_all_but_last(model: nn.Module, layers: Sequence[nn.Module], count: int | None) -> None:
    """Leaves only the last ``count`` of ``layers`` and the final norm trainable (``None``: all).

    Embeddings and the LM head are often one tied tensor; both stay frozen, so the engine's
    vocabulary projection never moves and the optimizer holds no state for it.
    """
    if count is None:
        return
    if count > len(layers):
        raise ValueError(
            f"trainable_layers={count} but the model has {len(layers)} decoder layers"
        )
    model.requires_grad_(False)
    for layer in layers[len(layers) - count :]:
        layer.requires_grad_(True)
    norm = getattr(getattr(model, "model", model), "norm", None)
    if count and norm is not None:
        norm.requires_grad_(True)


def store_frozen_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Keeps the parameters that never train in ``dtype``, the compute dtype: mixed precision
    casts them to it for every forward anyway (the same rounding), so every computed value is
    the same at half the memory (the demo's 24 frozen layers and embedding: 450 -> 225 MB).
    They come in ``dtype`` out of pushes, exports and checkpoints too."""
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def checkpoint_activations(layer: nn.Module) -> None:
    """Makes ``layer`` recompute its activations in the backward pass (non-reentrant).

    transformers' own gradient checkpointing acts only in train mode, and the policy stays in
    eval mode (no dropout), so the layer's forward is wrapped here instead.
    """
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layer.forward = recomputed  # type: ignore[method-assign]
