"""`RayWeights`: one full set of weights as Ray objects that trainer rank 0 owns, one per bucket.

For engines in Ray actors on other machines than rank 0 (so they cannot map its shared
memory): each actor fetches the buckets straight from rank 0's node, object store to object
store; the driver only holds the references, never a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["RayWeights"]


@dataclass(frozen=True)
class RayWeights:
    """A push's weights in the object store (a `WeightPush` of kind ``object_refs``)."""

    kind: ClassVar[Literal["object_refs"]] = "object_refs"
    serves_in_place: ClassVar[bool] = False
    refs: tuple[Any, ...]  # an ``ObjectRef`` of a `PackedTensors` per bucket, rank 0's
    tensors: int
    nbytes: int
    partial: bool = False  # only the tensors that may differ from the engines' model folder

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors, fetched from the object store (blocking; Ray must be initialised)."""
        import ray

        state: dict[str, torch.Tensor] = {}
        for packed in ray.get(list(self.refs)):
            state.update(packed.unpack())
        return state
