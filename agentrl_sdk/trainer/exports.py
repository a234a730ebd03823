"""`WeightExports`: a `TrainerGroup`'s weights as each kind of `WeightPush` (``group.weights``).

It plans the buckets once, asks the ranks for them and builds the push value. The exporters
below the class run inside each rank, on its `ShardedModel` (functions of a rank, for
`RankSet.call`): every rank gathers each bucket (a collective) and rank 0 hands it on, written
to its staged files, put in its object store, packed for the driver, or broadcast to a push
group. A new transport is one case in `export_weights` and, where it moves tensors its own way,
one exporter here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.ranks import RankSet
from agentrl_sdk.trainer.sharded_model import ShardedRank
from agentrl_sdk.trainer.worker import on_adapter
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.collective import (
    BucketLayout,
    CollectiveWeights,
    WeightGroup,
    broadcast_bucket,
    joined,
)
from agentrl_sdk.weights.object_refs import RayWeights
from agentrl_sdk.weights.push import StateDict, WeightIntake, WeightKind, WeightPush, cast_floating
from agentrl_sdk.weights.shared_files import SharedWeights
from agentrl_sdk.weights.tensor_transport import PackedTensors

__all__ = ["DEFAULT_BUCKET_BYTES", "WeightExports"]

DEFAULT_BUCKET_BYTES = 256 << 20
"""Default size of one weight bucket streamed out of the trainer."""


class WeightExports:
    """The weights of the trainer group's ``ranks``, as pushes (a `WeightSource`): bucket plans
    and layouts (the keys and shapes never change: planned once), the staged file set written
    last, the push group."""

    def __init__(self, ranks: RankSet, config: TrainerConfig) -> None:
        self._ranks = ranks
        self._config = config
        self._planned: dict[tuple[Any, ...], Any] = {}
        self._slot = 1  # the file set `stage` wrote last (0 or 1)
        self._push_group: tuple[tuple[Any, ...], WeightGroup] | None = None

    @property
    def staging_host(self) -> str:
        """The host (`host_id`) whose shared memory `stage` writes to: rank 0's."""
        return self._ranks.info["host"]

    @property
    def weight_offer(self) -> WeightIntake:
        """Full weights of every kind (files staged on rank 0's host; an in-process rank has no
        object store nor a process of its own to broadcast from), and the adapter alone when
        ``trainer.lora.sync`` is 'adapter'."""
        lora = self._config.lora
        kinds: set[WeightKind] = {"state_dict", "shared_files"}
        if self._config.placement == "ray":
            kinds |= {"object_refs", "collective"}
        if lora is not None and lora.sync == "adapter":
            kinds.add("adapter")
        return WeightIntake(frozenset(kinds), self.staging_host)

    def export_weights(
        self, kind: WeightKind, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        audience: tuple[int, ...] = (), dtype: str | None = None, changed_only: bool = False,
    ) -> WeightPush:  # fmt: skip
        """The current weights as a push of ``kind``, floating tensors in ``dtype``; with
        ``changed_only`` those that may differ from the model folder, a ``partial`` push (see
        `WeightSource`)."""
        match kind:
            case "adapter":
                adapter = self.adapter_weights()
                if adapter is None:
                    raise ValueError("an adapter push needs trainer.lora.sync: adapter")
                return adapter
            case "shared_files":
                return self.stage(bucket_bytes, dtype, changed_only)
            case "object_refs":
                return self.put(bucket_bytes, dtype, changed_only)
            case "collective":
                layouts = self._planned_once(bucket_layouts, bucket_bytes, dtype, changed_only)
                return CollectiveWeights(self._push_group_for(audience), layouts, changed_only)
            case "state_dict":
                buckets = list(self.full_state_dict(bucket_bytes, dtype, changed_only))
                state = {key: t for bucket in buckets for key, t in bucket.items()}
                return StateDict(state, len(buckets), changed_only)
        raise ValueError(f"unknown weight push kind {kind!r}")

    def send_weights(self, push: WeightPush) -> None:
        """Broadcast a `CollectiveWeights` push's buckets from rank 0 (rank 0 joins its group
        on the first one); the other kinds moved their tensors in `export_weights`."""
        if isinstance(push, CollectiveWeights):
            self._ranks.call(broadcast_buckets, push)

    def full_state_dict(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: str | None = None,
        changed_only: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:  # fmt: skip
        """Streams the full (unsharded, CPU) weights from rank 0, bucket by bucket.

        Each bucket is a dict of at most ``bucket_bytes`` (a single larger tensor comes alone;
        tied keys come together, sharing one tensor). The next bucket is gathered while the
        caller consumes the current one. Finish (or close) the iterator before the next call.
        Floating tensors come cast to ``dtype`` when given (on rank 0, before they travel).
        ``changed_only``: the tensors that may differ from the model folder alone.
        """
        ranks, plan = self._ranks, self._planned_once(bucket_plan, bucket_bytes, changed_only)
        gather, pending = gather_packed_bucket, None
        for keys in [*plan, None]:
            current, pending = pending, None if keys is None else ranks.submit(gather, keys, dtype)
            if current is not None:
                yield ranks.wait(current, gather)[0].unpack()

    def stage(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: str | None = None,
        changed_only: bool = False,
    ) -> SharedWeights:  # fmt: skip
        """Writes the full weights as bucket files in rank 0's shared memory; none pass here.

        Every rank gathers each bucket (a collective) and rank 0 writes it, all buckets in
        one call per rank, so gathering and writing never wait on this process. Calls alternate
        between two sets of files, each overwritten in place two calls later: every engine
        must have moved to the files of call k+1 before call k+2 (a push's version barrier
        ensures it), so until then engines may serve the mapped tensors without a copy.
        The files stay until the group shuts down. A rank dying meanwhile: the group is
        rebuilt (`trainer.max_restarts`) and the new rank 0 stages the weights again.
        """
        ranks, plan = self._ranks, self._planned_once(bucket_plan, bucket_bytes, changed_only)
        self._slot ^= 1
        # Files of their own per plan (all keys, or those a checkpoint may have widened):
        # a file is never resized under a reader.
        slot = f"{self._slot}-{hashlib.blake2s(repr(plan).encode(), digest_size=4).hexdigest()}"

        files = ranks.recovering(lambda: ranks.call(stage_buckets, plan, slot, dtype)[0])
        paths, counts, sizes = zip(*files, strict=True)
        host, folder = self.staging_host, os.path.dirname(paths[0])
        return SharedWeights(host, folder, paths, sum(counts), sum(sizes), changed_only)

    def put(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: str | None = None,
        changed_only: bool = False,
    ) -> RayWeights:  # fmt: skip
        """Puts the full weights in rank 0's object store, a Ray object per bucket; only the
        references come here. The objects live while a reference does (and rank 0)."""
        if self._config.placement != "ray":
            raise ValueError("weights in an object store need trainer.placement: ray")
        ranks, plan = self._ranks, self._planned_once(bucket_plan, bucket_bytes, changed_only)

        def put() -> list[tuple[list[Any], int, int]]:
            pending = [ranks.submit(put_bucket, keys, dtype) for keys in plan]
            return [ranks.wait(handles, put_bucket)[0] for handles in pending]

        buckets = ranks.recovering(put)
        return RayWeights(
            refs=tuple(ref for (ref,), _, _ in buckets),
            tensors=sum(count for _, count, _ in buckets),
            nbytes=sum(nbytes for _, _, nbytes in buckets),
            partial=changed_only,
        )

    def adapter_state_dict(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        """The full LoRA tensors (``trainer.lora`` only), by the keys of PEFT's
        ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight``)."""
        packed = self._ranks.call(*on_adapter(adapter, ShardedRank.gather_packed_adapter))[0]
        return packed.unpack()

    def adapter_weights(self, adapter: str | None = None) -> AdapterWeights | None:
        """The adapter as a push carries it when ``trainer.lora.sync`` is 'adapter' (see
        `WeightSync`); None otherwise (a push sends merged weights). A named ``adapter`` (one
        of several) always goes as itself, named: the engine serves it beside the others."""
        lora = self._config.lora
        if lora is None or (lora.sync != "adapter" and adapter is None):
            return None
        transposed = frozenset(self._ranks.info.get("lora_fan_in_fan_out", ()))
        tensors = self.adapter_state_dict(adapter)
        return AdapterWeights(tensors, lora.scaling, transposed, name=adapter)

    def forget_plans(self) -> None:
        """A checkpoint was loaded: the keys that may differ from the model folder may be more."""
        self._planned.clear()

    def _planned_once(self, planner: Callable[..., Any], *args: Any) -> Any:
        """Rank 0's ``planner(rank, *args)`` (`bucket_plan`, `bucket_layouts`), asked once: the
        keys and shapes never change until a checkpoint is loaded (`forget_plans`)."""
        key = (planner, *args)
        if key not in self._planned:
            self._planned[key] = self._ranks.call(planner, *args)[0]
        return self._planned[key]

    def _push_group_for(self, audience: tuple[int, ...]) -> WeightGroup:
        """The push group of rank 0 and the engines ``audience``: made anew when they change or
        the ranks were rebuilt (their rank 0 is a new process); NCCL on GPU trainers, else gloo."""
        ranks = self._ranks
        key = (ranks.restarts, audience)
        if self._push_group is None or self._push_group[0] != key:
            address = ranks.submit(ShardedRank.rendezvous_address, first_only=True)
            ip, port = ranks.wait(address, ShardedRank.rendezvous_address)[0]
            backend = "nccl" if ranks.info["device"].startswith("cuda") else "gloo"
            spec = WeightGroup(ip, port, 1 + len(audience), backend, self._config.call_timeout_s)
            self._push_group = (key, spec)
        return self._push_group[1]


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
        if (bucket := sharded.gather_bucket(keys, state, dtype)) is not None:
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


def broadcast_buckets(rank: ShardedRank, push: CollectiveWeights) -> None:
    """Every bucket of ``push`` gathered (a collective on every rank) and broadcast by rank 0
    to the push group (which it joins as rank 0 on the first push)."""
    member, device = joined(push.group, 0) if rank.sharded.rank == 0 else (None, None)
    for layout in push.layouts:
        state = rank.sharded.gather_bucket([slot.key for slot in layout.slots])
        if state is not None:
            broadcast_bucket(member, layout, state, device)
