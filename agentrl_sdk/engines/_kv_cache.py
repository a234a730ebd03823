"""The torch engine's KV cache: decode steps append into spare room instead of copying.

transformers' `DynamicLayer` grows by ``torch.cat``, so every decode step copies the whole
cache of every layer to add one column (~15% of a decode step at 48 rows x 350 tokens here).
`RoomyLayer` keeps its keys and values as views of buffers with room for more columns and
writes a step's column in place; only when the room runs out, or the batch replaced the
tensors (rows finished, rows merged), is there one copy, with room again.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["DECODE_ROOM", "RoomyCache", "RoomyLayer", "room_of"]

DECODE_ROOM = 64
"""Columns of room a decode step's copy leaves: one copy per this many decode steps."""


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` whose decode steps write into preallocated room.

    Room is made only for single-token appends (decode steps): a prefill's keys stay exactly
    their size, so views of them (prefix-cache entries) pin no spare memory.
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = _append(self.keys, key_states)
        self.values = _append(self.values, value_states)
        return self.keys, self.values


class RoomyCache(DynamicCache):
    """A `DynamicCache` of `RoomyLayer` (full-attention models: the TorchEngine refuses others)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self.layers = [RoomyLayer() for _ in self.layers]


def _append(cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``cached`` followed by ``new`` along the sequence axis: in ``cached``'s room if it has
    enough (tensors the running batch put in its place have none)."""
    if cached.numel() == 0:  # an uninitialised layer holds a 1-d empty tensor
        return new.contiguous()
    length, added = cached.shape[-2], new.shape[-2]
    room = room_of(cached)
    if room is not None and length + added <= room.shape[-2]:
        room[:, :, length : length + added] = new
        return _view(room, length + added)
    if added != 1:  # a prefill: exactly its size
        return torch.cat([cached, new], dim=-2)
    batch, heads, _, dim = cached.shape
    room = cached.new_zeros(batch, heads, length + added + DECODE_ROOM, dim)
    room[:, :, :length] = cached
    room[:, :, length : length + added] = new
    return _view(room, length + added)


def room_of(cached: torch.Tensor) -> torch.Tensor | None:
    """The buffer whose first columns ``cached`` (a `RoomyLayer`'s keys or values) is, if any:
    ``(B, H, R, D)``, zeros after those columns. Attention over the whole buffer (the rest
    masked out) skips the copy a matmul makes of a view with room."""
    return getattr(cached, "_room", None)


def _view(room: torch.Tensor, length: int) -> torch.Tensor:
    view = room[:, :, :length]
    view._room = room  # type: ignore[attr-defined]  # read by room_of
    return view
