"""The weight transports: each one's name (``trainer.weight_transport``), the push kinds it
tries and whether it needs a trainer on Ray, written once here (`TRANSPORTS`); `WeightSync` and
`TrainerConfig.weight_transport` read them from this registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl_sdk.weights.push import WeightKind

__all__ = ["TRANSPORTS", "TransportName", "WeightTransport"]


@dataclass(frozen=True)
class WeightTransport:
    """One way pushed weights take from the trainer to the engines: the full-weights ``kinds``
    it tries, in order (`WeightSync` takes the first the source makes and every engine takes;
    an adapter, when offered, comes first)."""

    kinds: tuple[WeightKind, ...]
    needs_ray: bool  # only a trainer on Ray (``trainer.placement: ray``) pushes this way
    summary: str  # what it does, for the config reference


TRANSPORTS: dict[str, WeightTransport] = {
    "auto": WeightTransport(
        ("shared_files", "object_refs", "state_dict"), needs_ray=False,
        summary="files in rank 0's shared memory when the engines share its machine, else "
        "rank 0's Ray object store, never through the driver",
    ),
    "collective": WeightTransport(
        ("collective", "shared_files", "object_refs", "state_dict"), needs_ray=True,
        summary="a broadcast group of rank 0 and the engines (NCCL on GPUs, gloo on CPU; "
        "Ray-actor and vLLM engines, not pools)",
    ),
    "object_store": WeightTransport(
        ("object_refs", "shared_files", "state_dict"), needs_ray=True,
        summary="rank 0's object store even on one machine (Ray-actor engines)",
    ),
    "driver": WeightTransport(
        ("state_dict",), needs_ray=False,
        summary="assembled in the driver (the way before these)",
    ),
}
"""Every weight transport by name: the one place a transport is named."""

TransportName = Literal[tuple(TRANSPORTS)]  # type: ignore[valid-type]
"""A transport's name (``trainer.weight_transport``, `WeightSync`'s ``transport``), from
`TRANSPORTS`."""
