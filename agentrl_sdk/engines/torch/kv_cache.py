"""The torch engine's KV cache: decode steps append into spare room instead of copying.

transformers' `DynamicLayer` grows by ``torch.cat``, so every decode step copies the whole
cache of every layer to add one column (~15% of a decode step at 48 rows x 350 tokens here).
`RoomyLayer` keeps its keys and values as views of buffers with room for more columns and
writes a step's column in place; only when the room runs out, or the batch replaced the
tensors, is there one copy, with room again. Rows that finish leave the buffer in place
(`keep_rows`: the survivors move up) and rows that join fill the rows they left
(`append_rows`), so the running batch does not copy its whole cache each time one does.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = [
    "DECODE_ROOM", "RoomyCache", "RoomyLayer", "append_rows", "fill_order", "fits", "keep_rows",
    "room_of",
]

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
    batch, length, added = cached.shape[0], cached.shape[-2], new.shape[-2]
    room = room_of(cached)
    if room is not None and length + added <= room.shape[-2]:
        room[:, :, length : length + added] = new
        return _view(_buffer(cached), batch, length + added)
    if added != 1:  # a prefill: exactly its size
        return torch.cat([cached, new], dim=-2)
    _, heads, _, dim = cached.shape
    buffer = cached.new_zeros(batch, heads, length + added + DECODE_ROOM, dim)
    buffer[:, :, :length] = cached
    buffer[:, :, length : length + added] = new
    return _view(buffer, batch, length + added)


@torch.inference_mode()  # the buffers are inference tensors: written in place only there
def keep_rows(cached: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Rows ``order`` of ``cached``, in that order. With a buffer, ``order`` must keep every
    row it keeps below ``len(order)`` in place (`fill_order`): only the rows from further down
    move, into the rows that left, and nothing else is copied."""
    buffer = _buffer(cached)
    if buffer is None:
        return cached.index_select(0, torch.tensor(order, dtype=torch.long))
    if holes := [new for new, old in enumerate(order) if new != old]:
        movers = torch.tensor([order[new] for new in holes], dtype=torch.long)
        buffer.index_copy_(0, torch.tensor(holes, dtype=torch.long), buffer.index_select(0, movers))
    return _view(buffer, len(order), cached.shape[-2])


def fill_order(indices: list[int]) -> list[int]:
    """An order of the rows ``indices`` (ascending) that leaves those among the first
    ``len(indices)`` rows where they are and moves the rest into the places of those left."""
    kept = len(indices)
    order = list(range(kept))
    holes = sorted(set(order) - set(indices))
    for hole, mover in zip(holes, [i for i in indices if i >= kept], strict=True):
        order[hole] = mover
    return order


@torch.inference_mode()
def append_rows(cached: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """``cached``'s rows then ``fresh``'s, written into the buffer's spare rows (the caller
    checks `fits` first: merging a batch is all layers or none).

    Both keep their columns' right end at the wider one's: a fresh row is left-padded with
    zeros, and when fresh rows are wider the cached rows gain a gap of masked columns before
    the next one (their position ids are their own, so a gap changes nothing).
    """
    if not fits(cached, fresh):
        raise ValueError("append_rows: the buffer has no room for these rows (check `fits`)")
    buffer = _buffer(cached)
    assert buffer is not None  # `fits` found it
    rows, width = cached.shape[0], max(cached.shape[-2], fresh.shape[-2])
    target = buffer[rows : rows + fresh.shape[0]]
    target[:, :, : width - fresh.shape[-2]].zero_()
    target[:, :, width - fresh.shape[-2] : width] = fresh
    return _view(buffer, rows + fresh.shape[0], width)


def fits(cached: torch.Tensor, fresh: torch.Tensor) -> bool:
    """Whether `append_rows` can place ``fresh`` in ``cached``'s buffer."""
    buffer = _buffer(cached)
    width = max(cached.shape[-2], fresh.shape[-2])
    return (
        buffer is not None
        and cached.shape[0] + fresh.shape[0] <= buffer.shape[0]
        and width < buffer.shape[-2]
        and fresh.shape[1:2] == buffer.shape[1:2]
    )


def room_of(cached: torch.Tensor) -> torch.Tensor | None:
    """The buffer whose first columns ``cached`` (a `RoomyLayer`'s keys or values) is, if any:
    ``(B, H, R, D)``, with masked-out finite values (zeros, or a row's that left) after those
    columns. Attention over the whole buffer (the rest masked out) skips the copy a matmul
    makes of a view with room."""
    buffer = _buffer(cached)
    return None if buffer is None else buffer[: cached.shape[0]]


def _buffer(cached: torch.Tensor) -> torch.Tensor | None:
    """The whole buffer behind ``cached``, its spare rows included."""
    return getattr(cached, "_room", None)


def _view(buffer: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    view = buffer[:rows, :, :length]
    view._room = buffer  # type: ignore[attr-defined]  # read by room_of
    return view
