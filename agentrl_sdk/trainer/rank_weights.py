"""The weight exporters that run inside a trainer rank, on its `ShardedModel` (functions of a
rank, for `RankSet.call`): every rank gathers each bucket (a collective) and rank 0 hands it
on, written to its staged files, put in its object store, packed for the driver, or broadcast
to a push group. `WeightExports` (in the driver) calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from agentrl_sdk.weights.collective import BucketLayout, CollectiveWeights, broadcast_bucket, joined
from agentrl_sdk.weights.push import cast_floating
from agentrl_sdk.weights.tensor_transport import PackedTensors

if TYPE_CHECKING:
    from agentrl_sdk.trainer.sharded_model import ShardedRank

__all__ = [
    "broadcast_buckets",
    "bucket_layouts",
    "bucket_plan",
    "gather_packed_bucket",
    "put_bucket",
    "stage_buckets",
]


def stage_buckets(
    rank: ShardedRank, plan: Sequence[Sequence[str]], slot: str, dtype: str | None
) -> list[tuple[str, int, int]] | None:
    """Each bucket of ``plan`` gathered (a collective) and written by rank 0 as staged file
    ``index`` of ``slot`` (see `WeightExports.stage`), in one call per push: no round trip per
    bucket. On rank 0, each file's path, tensor count and bytes; else None."""
    sharded = rank.sharded
    state = sharded.model.state_dict(keep_vars=True)
    files = []
    for index, keys in enumerate(plan):
        bucket = sharded.gather_bucket(keys, state, dtype)
        if bucket is not None:
            name = f"slot{slot}-{dtype or 'as-trained'}-bucket-{index:05d}.safetensors"
            files.append(sharded.staged.write(bucket, name))  # a dtype of its own: never resized
    return files if sharded.rank == 0 else None


def put_bucket(
    rank: ShardedRank, keys: Sequence[str], dtype: str | None
) -> tuple[list[Any], int, int] | None:
    """`gather_packed_bucket` put in this node's object store by rank 0 (a collective). On
    rank 0, ``[ref]`` (in a list, so Ray hands over the reference, not the object), its tensor
    count and distinct bytes; else None."""
    import ray

    packed = gather_packed_bucket(rank, keys, dtype)
    return None if packed is None else ([ray.put(packed)], len(packed.arrays), packed.nbytes)


def gather_packed_bucket(
    rank: ShardedRank, keys: Sequence[str], dtype: str | None
) -> PackedTensors | None:
    """`ShardedModel.gather_bucket` as numpy arrays, which leave the actor without a copy."""
    state = rank.sharded.gather_bucket(keys, dtype=dtype)
    return None if state is None else PackedTensors.pack(state)


def bucket_plan(
    rank: ShardedRank, bucket_bytes: int, changed_only: bool = False
) -> list[list[str]]:
    """Keys of the engine's full state dict (``changed_only``: of the tensors that may differ
    from the model folder, `ShardedModel.changed_keys`) cut into buckets of at most
    ``bucket_bytes`` (unsharded). With LoRA these are the base model's keys, for merged weights.

    Tied parameters (one tensor under several keys) stay in one bucket; a tensor larger
    than the budget gets a bucket of its own. Identical on every rank.
    """
    changed = rank.sharded.changed_keys() if changed_only else None
    buckets: list[list[str]] = []
    size = 0
    for keys, tensor in rank.sharded.engine_tensors():
        if changed is not None and changed.isdisjoint(keys):
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if buckets and size + nbytes <= bucket_bytes:
            buckets[-1].extend(keys)
            size += nbytes
        else:
            buckets.append(list(keys))
            size = nbytes
    return buckets


def bucket_layouts(
    rank: ShardedRank, bucket_bytes: int, dtype: str | None, changed_only: bool = False
) -> tuple[BucketLayout, ...]:
    """How each bucket of `bucket_plan` is laid out for a broadcast, its
    floating tensors in ``dtype`` (None: the trainer's)."""
    meta = {}
    for keys, tensor in rank.sharded.engine_tensors():
        full = cast_floating(torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"), dtype)
        meta |= dict.fromkeys(keys, full)  # tied keys: one tensor object
    plan = bucket_plan(rank, bucket_bytes, changed_only)
    return tuple(BucketLayout.of({k: meta[k] for k in keys}) for keys in plan)


def broadcast_buckets(rank: ShardedRank, push: CollectiveWeights) -> int:
    """Every bucket of ``push`` gathered (a collective on every rank) and broadcast by rank 0
    to the push group (which it joins as rank 0 on the first push); returns the bytes."""
    member, device = joined(push.group, 0) if rank.sharded.rank == 0 else (None, None)
    sent = 0
    for layout in push.layouts:
        state = rank.sharded.gather_bucket([slot.key for slot in layout.slots])
        if state is not None:
            broadcast_bucket(member, layout, state, device)
            sent += layout.nbytes
    return sent
