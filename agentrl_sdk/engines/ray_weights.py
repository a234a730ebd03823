"""`RayWeights`: one full set of weights as Ray objects that trainer rank 0 owns, one per bucket.

For engines in Ray actors on other machines than rank 0 (so they cannot map its shared
memory): each actor fetches the buckets straight from rank 0's node, object store to object
store; the driver only holds the references, never a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["RayWeights", "RayWeightsEngine"]


@dataclass(frozen=True)
class RayWeights:
    """A push's weights in the object store.

    Attributes:
        refs: One ``ObjectRef`` of a `PackedTensors` per bucket, owned by trainer rank 0.
        tensors: How many tensors the buckets hold.
        nbytes: Their bytes.
    """

    refs: tuple[Any, ...]
    tensors: int
    nbytes: int


@runtime_checkable
class RayWeightsEngine(Protocol):
    """An engine that fetches `RayWeights` itself (an engine in a Ray actor)."""

    @property
    def takes_ray_weights(self) -> bool:
        """Whether the engine fetches object references itself."""
        ...

    async def update_ray_weights(self, weights: RayWeights) -> int:
        """Load ``weights`` as `update_weights` would; returns the new policy version."""
        ...
