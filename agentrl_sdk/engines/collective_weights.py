"""Weights over a collective group between trainer rank 0 and the engines' processes: NCCL on
GPU (GPU to GPU, as verl and OpenRLHF push to vLLM), gloo on CPU (the same code, tested here).

Rank 0 of the group is the trainer's rank 0; the engines (torch engines in Ray actors, or
vLLM's workers themselves) are ranks 1..N. A push is one broadcast per bucket: rank 0 flattens
the bucket into one buffer, every engine receives it into a buffer of its own and loads the
views. The driver only creates the group and hands out the buckets' layouts, never a tensor.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = [
    "BucketLayout",
    "CollectiveWeightsEngine",
    "TensorSlot",
    "WeightGroup",
    "broadcast_bucket",
    "receive_buckets",
]


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor sits in a flattened bucket (tied keys share an offset)."""

    key: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class BucketLayout:
    """The tensors of one bucket laid out in one byte buffer, each aligned to 16 bytes."""

    slots: tuple[TensorSlot, ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> BucketLayout:
        """The layout of ``tensors`` (shapes and dtypes only: no data is read)."""
        slots, offsets, size = [], {}, 0
        for key, tensor in tensors.items():
            if id(tensor) not in offsets:  # tied keys hold one tensor object: one slot
                offsets[id(tensor)] = size
                size += -(-tensor.numel() * tensor.element_size() // 16) * 16
            slots.append(TensorSlot(key, str(tensor.dtype).removeprefix("torch."),
                                    tuple(tensor.shape), offsets[id(tensor)]))  # fmt: skip
        return cls(tuple(slots), size)

    def flatten(self, tensors: Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """One buffer holding ``tensors`` at their slots (a copy)."""
        buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        for slot, view in zip(self.slots, self._views(buffer), strict=True):
            view.copy_(tensors[slot.key])
        return buffer

    def unflatten(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tensors by key, as views of ``buffer``."""
        return {slot.key: view for slot, view in zip(self.slots, self._views(buffer), strict=True)}

    def _views(self, buffer: torch.Tensor) -> Iterator[torch.Tensor]:
        for slot in self.slots:
            dtype = getattr(torch, slot.dtype)
            count = 1
            for dim in slot.shape:
                count *= dim
            end = slot.offset + count * dtype.itemsize
            yield buffer[slot.offset : end].view(dtype).view(slot.shape)

    def to_json(self) -> dict[str, Any]:
        """Plain data for RPCs that only carry JSON-like values (vLLM's ``collective_rpc``)."""
        return {"nbytes": self.nbytes, "slots": [[s.key, s.dtype, list(s.shape), s.offset]
                                                 for s in self.slots]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BucketLayout:
        """The layout `to_json` wrote."""
        slots = tuple(TensorSlot(k, d, tuple(s), o) for k, d, s, o in data["slots"])
        return cls(slots, int(data["nbytes"]))


@dataclass(frozen=True)
class WeightGroup:
    """How to join a push group: rank 0's store address, the group size, the backend."""

    address: str
    port: int
    world_size: int
    backend: Literal["gloo", "nccl"]
    timeout_s: float = 600.0

    def join(self, rank: int) -> Any:
        """Join as ``rank`` (blocks until every rank joined); returns the process group."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(self.address, self.port, self.world_size, rank == 0, timeout=timeout)
        if self.backend == "nccl":
            return dist.ProcessGroupNCCL(store, rank, self.world_size)
        return dist.ProcessGroupGloo(store, rank, self.world_size, timeout)

    def device(self) -> torch.device:
        """Where this group's buffers live."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def to_json(self) -> dict[str, Any]:
        """Plain data for RPCs that only carry JSON-like values."""
        return {"address": self.address, "port": self.port, "world_size": self.world_size,
                "backend": self.backend, "timeout_s": self.timeout_s}  # fmt: skip


def broadcast_bucket(
    group: Any, layout: BucketLayout, tensors: Mapping[str, torch.Tensor], device: torch.device
) -> None:
    """Rank 0's side of one bucket: flatten ``tensors`` by ``layout`` and broadcast them."""
    group.broadcast(layout.flatten(tensors, device), 0).wait()


def receive_buckets(
    group: Any, layouts: Sequence[BucketLayout], device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """An engine's side: each bucket's tensors as rank 0 broadcasts them, in order."""
    for layout in layouts:
        buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
        group.broadcast(buffer, 0).wait()
        yield layout.unflatten(buffer)


@runtime_checkable
class CollectiveWeightsEngine(Protocol):
    """An engine whose process(es) join a `WeightGroup` and receive pushes by broadcast."""

    @property
    def takes_collective_weights(self) -> bool:
        """Whether the engine can join a push group."""
        ...

    async def join_weight_group(self, group: WeightGroup, rank: int) -> None:
        """Join ``group`` as ``rank`` (returns once every rank joined)."""
        ...

    async def update_collective_weights(self, layouts: Sequence[BucketLayout]) -> int:
        """Receive the buckets rank 0 broadcasts and load them; returns the new version."""
        ...
