"""The trainer's side of weight pushes: a `TrainerGroup`'s weights as each kind of `WeightPush`.

`WeightExports` (in the driver) plans the buckets once, asks the ranks for them and builds the
push value; the functions below run inside the ranks on their `ShardedModel` (the worker's
``run``), every rank gathering each bucket (a collective) and rank 0 handing it on: written to
staged files, put in its object store, packed for the driver, or broadcast to a push group. A
new transport is one case in `WeightExports.export` and, where it moves tensors its own way, one
function here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from agentrl_sdk.engines.collective_weights import (
    BucketLayout,
    CollectiveWeights,
    WeightGroup,
    broadcast_bucket,
    joined,
)
from agentrl_sdk.engines.ray_weights import RayWeights
from agentrl_sdk.engines.shared_weights import (
    SharedWeights,
    StagedFile,
    make_stage_folder,
    remove_stage_folder,
)
from agentrl_sdk.engines.tensor_transport import PackedTensors
from agentrl_sdk.engines.weights import (
    StateDict,
    WeightIntake,
    WeightKind,
    WeightPush,
    cast_floating,
)

if TYPE_CHECKING:
    from agentrl_sdk.trainer.group import TrainerGroup
    from agentrl_sdk.trainer.sharded_model import ShardedModel

__all__ = ["WeightExports", "release_staged"]


class WeightExports:
    """The driver's side of a `TrainerGroup`'s pushes: bucket plans and layouts (the keys and
    shapes never change: planned once), the staged file set written last, the push group.

    Args:
        group: The trainer group whose ranks hold the weights.
    """

    def __init__(self, group: TrainerGroup) -> None:
        self._group = group
        self._plans: dict[tuple[int, bool], list[list[str]]] = {}
        self._layouts: dict[tuple[int, str | None, bool], tuple[BucketLayout, ...]] = {}
        self._slot = 1  # the file set `stage` wrote last (0 or 1)
        self._push_group: tuple[tuple[Any, ...], WeightGroup] | None = None

    def offer(self) -> WeightIntake:
        """Full weights of every kind (files staged on rank 0's host; an in-process rank has no
        object store nor a process of its own to broadcast from), and the adapter alone when
        ``trainer.lora.sync`` is 'adapter'."""
        config = self._group.config
        lora = config.lora
        kinds: set[WeightKind] = {"state_dict", "shared_files"}
        if config.placement == "ray":
            kinds |= {"object_refs", "collective"}
        if lora is not None and lora.sync == "adapter":
            kinds.add("adapter")
        return WeightIntake(frozenset(kinds), self._group.staging_host)

    def export(
        self, kind: WeightKind, bucket_bytes: int, audience: tuple[int, ...], dtype: str | None,
        changed_only: bool = False,
    ) -> WeightPush:  # fmt: skip
        """The group's current weights as a push of ``kind``, floating tensors in ``dtype``;
        with ``changed_only`` those that may differ from the model folder, a ``partial`` push
        (see `WeightSource`)."""
        group = self._group
        match kind:
            case "adapter":
                adapter = group.adapter_weights()
                if adapter is None:
                    raise ValueError("an adapter push needs trainer.lora.sync: adapter")
                return adapter
            case "shared_files":
                return group.stage_weights(bucket_bytes, dtype, changed_only)
            case "object_refs":
                return group.put_weights(bucket_bytes, dtype, changed_only)
            case "collective":
                layouts = self.layouts(bucket_bytes, dtype, changed_only)
                return CollectiveWeights(self._push_group_for(audience), layouts, changed_only)
            case "state_dict":
                state: dict[str, torch.Tensor] = {}
                buckets = 0
                for bucket in group.full_state_dict(bucket_bytes, dtype, changed_only):
                    state.update(bucket)
                    buckets += 1
                return StateDict(state, buckets, changed_only)
        raise ValueError(f"unknown weight push kind {kind!r}")

    def send(self, push: WeightPush) -> None:
        """Broadcast a `CollectiveWeights` push's buckets from rank 0 (rank 0 joins its group
        on the first one); the other kinds moved their tensors in `export`."""
        if isinstance(push, CollectiveWeights):
            self._group._call("run", broadcast_buckets, push)

    def plan(self, bucket_bytes: int, changed_only: bool = False) -> list[list[str]]:
        """The engine keys (``changed_only``: those that may differ from the model folder) cut
        into buckets of at most ``bucket_bytes``."""
        plan = self._plans.get((bucket_bytes, changed_only))
        if plan is None:
            plan = self._group._call("run", bucket_plan, bucket_bytes, changed_only)[0]
            self._plans[bucket_bytes, changed_only] = plan
        return plan

    def forget_plans(self) -> None:
        """A checkpoint was loaded: the keys that may differ from the model folder may be more."""
        self._plans.clear()
        self._layouts.clear()

    def layouts(
        self, bucket_bytes: int, dtype: str | None, changed_only: bool = False
    ) -> tuple[BucketLayout, ...]:
        """The broadcast layout of each bucket (shapes and dtypes)."""
        key = (bucket_bytes, dtype, changed_only)
        layouts = self._layouts.get(key)
        if layouts is None:
            call = ("run", bucket_layouts, bucket_bytes, dtype, changed_only)
            layouts = self._layouts[key] = tuple(self._group._call(*call)[0])
        return layouts

    def stage(
        self, bucket_bytes: int, dtype: str | None, changed_only: bool = False
    ) -> SharedWeights:
        """Every bucket gathered and written by rank 0 to the file set not written last (see
        `TrainerGroup.stage_weights`)."""
        group, plan = self._group, self.plan(bucket_bytes, changed_only)
        self._slot ^= 1
        # Files of their own per plan (all keys, or those a checkpoint may have widened):
        # a file is never resized under a reader.
        slot = f"{self._slot}-{hashlib.blake2s(repr(plan).encode(), digest_size=4).hexdigest()}"

        def stage() -> list[tuple[str, int, int]]:
            refs = group._submit("run", stage_buckets, plan, slot, dtype)
            return group._wait(refs, "stage_buckets")[0]

        files = group._recovering(stage)
        return SharedWeights(
            host=group.staging_host,
            folder=os.path.dirname(files[0][0]),
            paths=tuple(path for path, _, _ in files),
            tensors=sum(count for _, count, _ in files),
            nbytes=sum(nbytes for _, _, nbytes in files),
            partial=changed_only,
        )

    def put(self, bucket_bytes: int, dtype: str | None, changed_only: bool = False) -> RayWeights:
        """Every bucket put in rank 0's object store; only the references come here."""
        if self._group.config.placement != "ray":
            raise ValueError("weights in an object store need trainer.placement: ray")
        group, plan = self._group, self.plan(bucket_bytes, changed_only)

        def put() -> list[tuple[list[Any], int, int]]:
            pending = [group._submit("run", put_bucket, keys, dtype) for keys in plan]
            return [group._wait(refs, "put_bucket")[0]
                    for refs in pending]  # fmt: skip

        buckets = group._recovering(put)
        return RayWeights(
            refs=tuple(ref for (ref,), _, _ in buckets),
            tensors=sum(count for _, count, _ in buckets),
            nbytes=sum(nbytes for _, _, nbytes in buckets),
            partial=changed_only,
        )

    def stream(
        self, bucket_bytes: int, dtype: str | None, changed_only: bool = False
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The buckets through this process, the next one gathered while the caller reads
        the current one."""
        group, plan = self._group, self.plan(bucket_bytes, changed_only)
        pending = group._submit("run", gather_packed_bucket, plan[0], dtype) if plan else None
        for i in range(len(plan)):
            current = pending
            if i + 1 < len(plan):
                pending = group._submit("run", gather_packed_bucket, plan[i + 1], dtype)
            packed = group._wait(current, "gather_packed_bucket")[0]
            yield packed.unpack()

    def _push_group_for(self, audience: tuple[int, ...]) -> WeightGroup:
        """The push group of rank 0 and the engines ``audience``: made anew when they change or
        the group was rebuilt (its rank 0 is a new process); NCCL on GPU trainers, else gloo."""
        key = (self._group.restarts, audience)
        if self._push_group is None or self._push_group[0] != key:
            group = self._group
            address = group._submit("rendezvous_address", first_only=True)
            ip, port = group._wait(address, "weight_group")[0]
            backend = "nccl" if group.info["device"].startswith("cuda") else "gloo"
            spec = WeightGroup(ip, port, 1 + len(audience), backend, group.config.call_timeout_s)
            self._push_group = (key, spec)
        return self._push_group[1]


# ------------------------------------------------------------------ inside the ranks


class _StagedFiles:
    """Rank 0's staged bucket files, kept for the process's life: the first push to a slot
    writes them, later pushes overwrite their tensors in place (`StagedFile`)."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.files: dict[str, StagedFile] = {}

    def write(self, bucket: dict[str, torch.Tensor], name: str) -> tuple[str, int, int]:
        if self.folder is None:
            self.folder = make_stage_folder()
        path = f"{self.folder}/{name}"
        staged = self.files.get(path)
        if staged is None:
            staged = self.files[path] = StagedFile(path, bucket)
            return path, len(bucket), staged.nbytes
        return path, len(bucket), staged.overwrite(bucket)

    def release(self) -> None:
        if self.folder is not None:
            self.files.clear()
            remove_stage_folder(self.folder)
            self.folder = None


_STAGED = _StagedFiles()


def release_staged() -> None:
    """Delete this process's staged weight files (a rank closing)."""
    _STAGED.release()


def stage_buckets(
    worker: ShardedModel, plan: Sequence[Sequence[str]], slot: str, dtype: str | None
) -> list[tuple[str, int, int]] | None:
    """Each bucket of ``plan`` gathered (a collective) and written by rank 0 as staged file
    ``index`` of ``slot`` (0 or 1, and the plan's digest), in one call per push (one state
    dict, no round trip per bucket). Pushes alternate slots, so an engine may serve the
    tensors of one push straight from its files until the next push has moved it to the
    other slot.

    Returns:
        On rank 0, each file's path, tensor count and bytes; else None.
    """
    state = worker.model.state_dict(keep_vars=True)
    files = []
    for index, keys in enumerate(plan):
        bucket = worker.gather_bucket(keys, state, dtype)
        if bucket is not None:
            name = f"slot{slot}-{dtype or 'as-trained'}-bucket-{index:05d}.safetensors"
            files.append(_STAGED.write(bucket, name))  # a dtype of its own: never resized
    return files if worker.rank == 0 else None


def put_bucket(
    worker: ShardedModel, keys: Sequence[str], dtype: str | None
) -> tuple[list[Any], int, int] | None:
    """`ShardedModel.gather_bucket` put in this node's object store by rank 0 (a collective).

    Returns:
        On rank 0, ``[ref]`` (in a list, so Ray hands over the reference, not the object),
        its tensor count and distinct bytes; else None.
    """
    import ray

    state = worker.gather_bucket(keys, dtype=dtype)
    if state is None:
        return None
    unique = {id(t): t for t in state.values()}.values()
    nbytes = sum(t.numel() * t.element_size() for t in unique)
    return [ray.put(PackedTensors.pack(state))], len(state), nbytes


def gather_packed_bucket(
    worker: ShardedModel, keys: Sequence[str], dtype: str | None
) -> PackedTensors | None:
    """`ShardedModel.gather_bucket` as numpy arrays, which leave the actor without a copy."""
    state = worker.gather_bucket(keys, dtype=dtype)
    return None if state is None else PackedTensors.pack(state)


def bucket_plan(
    worker: ShardedModel, bucket_bytes: int, changed_only: bool = False
) -> list[list[str]]:
    """Keys of the engine's full state dict (``changed_only``: of the tensors that may differ
    from the model folder, `ShardedModel.changed_keys`) cut into buckets of at most
    ``bucket_bytes`` (unsharded). With LoRA these are the base model's keys, for merged weights.

    Tied parameters (one tensor under several keys) stay in one bucket; a tensor larger
    than the budget gets a bucket of its own. Identical on every rank.
    """
    changed = worker.changed_keys() if changed_only else None
    buckets: list[list[str]] = []
    size = 0
    for keys, tensor in worker.engine_tensors():
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
    worker: ShardedModel, bucket_bytes: int, dtype: str | None, changed_only: bool = False
) -> list[BucketLayout]:
    """How each bucket of `bucket_plan` is laid out for a broadcast, its
    floating tensors in ``dtype`` (None: the trainer's)."""
    meta = {}
    for keys, tensor in worker.engine_tensors():
        full = cast_floating(torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"), dtype)
        meta |= dict.fromkeys(keys, full)  # tied keys: one tensor object
    plan = bucket_plan(worker, bucket_bytes, changed_only)
    return [BucketLayout.of({k: meta[k] for k in keys}) for keys in plan]


def broadcast_buckets(worker: ShardedModel, push: CollectiveWeights) -> int:
    """Every bucket of ``push`` gathered (a collective on every rank) and broadcast by rank 0
    to the push group (which it joins as rank 0 on the first push); returns the bytes."""
    member, device = joined(push.group, 0) if worker.rank == 0 else (None, None)
    sent = 0
    for layout in push.layouts:
        state = worker.gather_bucket([slot.key for slot in layout.slots])
        if state is not None:
            broadcast_bucket(member, layout, state, device)
            sent += layout.nbytes
    return sent
