"""The weight handoff: what one push carries (`WeightPush`: one typed value per transport,
`StateDict`, `SharedWeights`, `RayWeights`, `CollectiveWeights` or `AdapterWeights`), which
kinds an engine takes (`WeightIntake`), and the version a push installs.

A full-weights push is ``partial`` when it carries only the tensors that may differ from the
engines' model folder (those the trainer trains; `WeightSync`'s ``changed_only``): the others
keep the values the engines loaded.

Every full-weights kind turns into tensors where it is read (``state_dict()``), so an engine
that takes only tensors still takes any of them once something materialises them (a Ray
actor does, for the engine inside it). An engine says which kinds it takes as data
(`WeightIntake`); wrappers (pools, views, actors, gates) forward `Engine.load_weights`.

The version is assigned by the driver: the trainer updates the weights have seen. An engine
reports exactly that number for the weights it serves (and stamps it on tokens), so pools,
replicas, adapters and the staleness rule all count alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.collective import CollectiveWeights
from agentrl_sdk.weights.object_refs import RayWeights
from agentrl_sdk.weights.shared_files import SharedWeights

if TYPE_CHECKING:
    import torch

__all__ = [
    "PushSize",
    "StateDict",
    "WeightIntake",
    "WeightKind",
    "WeightPush",
    "cast_floating",
    "size_of",
]

WeightKind = Literal["state_dict", "shared_files", "object_refs", "collective", "adapter"]
"""The kinds of `WeightPush`, as an engine's `WeightIntake` names them."""

@dataclass(frozen=True)
class StateDict:
    """Full weights as tensors by key (tied keys may share one tensor).

    Pickled (to a Ray actor) as numpy arrays (`PackedTensors`), which Ray moves without copies.
    """

    kind: ClassVar[WeightKind] = "state_dict"
    serves_in_place: ClassVar[bool] = False  # the caller may reuse the tensors: copy them
    tensors: Mapping[str, torch.Tensor]
    buckets: int = field(default=1, compare=False)  # how many the source streamed them in
    partial: bool = False  # only some of the model's tensors (see the module docstring)

    def state_dict(self) -> Mapping[str, torch.Tensor]:
        """The tensors."""
        return self.tensors

    def __reduce__(self) -> tuple[Any, ...]:
        from agentrl_sdk.weights.tensor_transport import PackedTensors

        packed = PackedTensors.pack(self.tensors)
        return _unpacked_state_dict, (packed, self.buckets, self.partial)


def _unpacked_state_dict(packed: Any, buckets: int, partial: bool = False) -> StateDict:
    return StateDict(packed.unpack(), buckets, partial)


WeightPush = StateDict | SharedWeights | RayWeights | CollectiveWeights | AdapterWeights
"""One weight push, of one kind (see the module docstring)."""


@dataclass(frozen=True)
class WeightIntake:
    """The push kinds an engine takes, as data.

    Attributes:
        kinds: The `WeightKind` s it loads.
        shared_host: The `host_id` whose shared memory it maps `SharedWeights` from (None: it
            cannot map staged files, e.g. a remote server); ``shared_files`` needs it.
        dtype: The floating dtype it serves full weights in (``"bfloat16"``, ...), so a
            source sends them cast already: half the bytes of float32 to move and map, and
            staged files served in place. None: it takes any and casts them itself.
    """

    kinds: frozenset[WeightKind]
    shared_host: str | None = None
    dtype: str | None = None

    def takes(self, kind: WeightKind, host: str | None = None) -> bool:
        """Whether a push of ``kind`` (staged on ``host``, for shared files) can be loaded."""
        if kind == "shared_files":
            return kind in self.kinds and host is not None and self.shared_host == host
        return kind in self.kinds

    def accepts(self, push: WeightPush) -> bool:
        """Whether ``push`` itself can be loaded (its kind, and its host for staged files)."""
        return self.takes(push.kind, push.host if isinstance(push, SharedWeights) else None)

    @classmethod
    def common(cls, intakes: Iterable[WeightIntake]) -> WeightIntake:
        """What every one of ``intakes`` takes (a pool's replicas, a push's engines)."""
        intakes = list(intakes)
        if not intakes:
            return cls(frozenset())
        kinds = frozenset.intersection(*(i.kinds for i in intakes))
        hosts = {i.shared_host for i in intakes}
        host = hosts.pop() if len(hosts) == 1 else None
        dtypes = {i.dtype for i in intakes}
        dtype = dtypes.pop() if len(dtypes) == 1 else None  # mixed: each casts its own
        return cls(kinds if host is not None else kinds - {"shared_files"}, host, dtype)


class PushSize(NamedTuple):
    """How big a push is: tensors, their distinct bytes, and the buckets they travel in."""

    tensors: int
    nbytes: int
    buckets: int


def cast_floating(tensor: torch.Tensor, dtype: str | None) -> torch.Tensor:
    """``tensor`` in ``dtype`` (a name: ``"bfloat16"``) if it is floating, else as it is; the
    cast rounds to nearest, as an engine's copy into its own dtype does."""
    import torch

    if dtype is None or not tensor.is_floating_point():
        return tensor
    return tensor.to(getattr(torch, dtype))


def size_of(push: WeightPush) -> PushSize:
    """The size of ``push`` (for `SyncStats` and logs)."""
    match push:
        case StateDict(tensors=tensors):
            unique = {id(t): t for t in tensors.values()}.values()
            nbytes = sum(t.numel() * t.element_size() for t in unique)
            return PushSize(len(tensors), nbytes, push.buckets)
        case SharedWeights():
            return PushSize(push.tensors, push.nbytes, len(push.paths))
        case RayWeights():
            return PushSize(push.tensors, push.nbytes, len(push.refs))
        case CollectiveWeights(layouts=layouts):
            return PushSize(sum(len(x.slots) for x in layouts),
                            sum(x.nbytes for x in layouts), len(layouts))  # fmt: skip
        case AdapterWeights():
            return PushSize(len(push.tensors), push.nbytes, 1)
    raise TypeError(f"not a weight push: {type(push).__name__}")
