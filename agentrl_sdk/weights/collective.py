"""Weights over a collective group between trainer rank 0 and the engines' processes: NCCL on
GPU (GPU to GPU, as verl and OpenRLHF push to vLLM), gloo on CPU (the same code, tested here).

Rank 0 of the group is the trainer's rank 0; the engines (torch engines in Ray actors, or
vLLM's workers themselves) are ranks 1..N, in the order they join. A push
(`CollectiveWeights`: the group and the buckets' layouts, the same value for every engine) is
one broadcast per bucket: rank 0 flattens the bucket into one buffer, every engine receives it
into a buffer of its own and loads the views. A process joins a group on its first push through
it and stays a member (`joined`). The driver only hands out the group and the layouts, never a
tensor.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

__all__ = [
    "BucketLayout",
    "CollectiveWeights",
    "TensorSlot",
    "WeightGroup",
    "broadcast_bucket",
    "joined",
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
            end = slot.offset + math.prod(slot.shape) * dtype.itemsize
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

    def join(self, rank: int | None = None) -> Any:
        """Join as ``rank`` (None: the next engine rank, 1..N, in the order engines join;
        blocks until every rank joined); returns the process group."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(self.address, self.port, self.world_size, rank == 0, timeout=timeout)
        if rank is None:
            rank = store.add(_NEXT_RANK, 1)
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
        return dataclasses.asdict(self)


def broadcast_bucket(
    group: Any, layout: BucketLayout, tensors: Mapping[str, torch.Tensor], device: torch.device
) -> None:
    """Rank 0's side of one bucket: flatten ``tensors`` by ``layout`` and broadcast them."""
    group.broadcast(layout.flatten(tensors, device), 0).wait()


_NEXT_RANK = "agentrl/next_engine_rank"
_JOINED: dict[WeightGroup, tuple[Any, torch.device]] = {}
_JOINING = threading.Lock()


def joined(group: WeightGroup, rank: int | None = None) -> tuple[Any, torch.device]:
    """This process's membership of ``group`` and its buffers' device, joining on first use
    (as ``rank``; None: the next engine rank). Blocks until every rank joined."""
    with _JOINING:
        member = _JOINED.get(group)
        if member is None:
            member = _JOINED[group] = (group.join(rank), group.device())
        return member


@dataclass(frozen=True)
class CollectiveWeights:
    """A push by broadcast (a `WeightPush` of kind ``collective``): the push group and each
    bucket's layout. The tensors arrive while the engines load it, as rank 0 sends them.
    ``partial``: only the tensors that may differ from the engines' model folder."""

    kind: ClassVar[Literal["collective"]] = "collective"
    serves_in_place: ClassVar[bool] = False
    group: WeightGroup
    layouts: tuple[BucketLayout, ...]
    partial: bool = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every bucket rank 0 broadcasts, received in this process (joining the group on the
        first push; blocking)."""
        member, device = joined(self.group)
        state: dict[str, torch.Tensor] = {}
        for layout in self.layouts:
            buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
            member.broadcast(buffer, 0).wait()
            state.update(layout.unflatten(buffer))
        return state

    def to_json(self) -> dict[str, Any]:
        """Plain data for RPCs that only carry JSON-like values (vLLM's ``collective_rpc``)."""
        return {"group": self.group.to_json(), "layouts": [x.to_json() for x in self.layouts],
                "partial": self.partial}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CollectiveWeights:
        """The push `to_json` wrote."""
        return cls(WeightGroup(**data["group"]),
                   tuple(BucketLayout.from_json(x) for x in data["layouts"]),
                   data.get("partial", False))  # fmt: skip
