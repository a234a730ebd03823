"""`WeightSync`: the one path weights take from the trainer to the inference engines."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from agentrl_sdk.engines.lora_weights import AdapterEngine, AdapterWeights
from agentrl_sdk.engines.shared_weights import SharedWeightsEngine
from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.threads import run_blocking

if TYPE_CHECKING:
    import torch

    from agentrl_sdk.engines.base import Engine

__all__ = ["SyncStats", "Via", "WeightSource", "WeightSync", "WeightSyncError"]

Via = Literal["adapter", "shared_memory", "collective", "object_store", "driver"]
"""The way a push took (`WeightSync`)."""

logger = logging.getLogger(__name__)


class WeightSyncError(AgentRLError):
    """Engines did not all take the new weights (a failure, a timeout or diverging versions)."""


class WeightSource(Protocol):
    """Where weights come from: `TrainerGroup`, or anything that streams a full state dict.

    A source may also offer ``adapter_weights() -> AdapterWeights | None``: when it returns an
    adapter and every engine takes adapters (`AdapterEngine`), a push moves the adapter only.
    """

    def full_state_dict(self, bucket_bytes: int = ...) -> Iterator[dict[str, torch.Tensor]]:
        """The full weights, as buckets of at most ``bucket_bytes``."""
        ...


@dataclass(frozen=True)
class SyncStats:
    """What one `WeightSync.push` did and how long each part took."""

    version: int
    engines: int
    tensors: int
    bytes: int
    buckets: int
    gather_s: float  # streaming the buckets out of the trainer
    load_s: float  # the engines' update_weights, concurrently
    total_s: float
    adapter: bool = False  # only LoRA adapter tensors moved (the engines merged them)
    via: Via = "driver"  # the way the weights took (see `WeightSync`)

    def as_metrics(self, prefix: str = "weight_sync/") -> dict[str, float]:
        """Flat metrics for a tracker."""
        return {
            f"{prefix}{k}": float(v)
            for k, v in vars(self).items()
            if k in ("bytes", "buckets", "gather_s", "load_s", "total_s")
        }


class WeightSync:
    """Streams the trainer's weights in buckets and loads them into every engine.

    Three ways, the first that applies:

    - A LoRA trainer with ``lora.sync='adapter'`` sends its adapter alone when every engine
      takes adapters.
    - Direct from a `TrainerGroup` (``transport`` 'auto' or 'collective'), never through
      this process, whose memory does not grow with the model:
      - ``shared_memory``: every engine maps files on the machine of the trainer's rank 0
        (`SharedWeightsEngine`: torch engines here or in Ray actors there, vLLM): rank 0
        writes the buckets to /dev/shm as it gathers them, each engine loads from there.
      - ``collective`` (only when asked, ``transport='collective'``): rank 0 and the engines'
        processes form a push group (`WeightGroup`: NCCL on GPU, GPU to GPU as verl and
        OpenRLHF push to vLLM; gloo on CPU) and each bucket is broadcast. Every engine must
        join (Ray-actor engines, vLLM; not pools), and one dying mid-push stalls it until
        ``timeout_s``: the other ways isolate engine faults.
      - ``object_store``: every engine is a Ray actor (`RayWeightsEngine`), some elsewhere
        (or ``transport='object_store'``): rank 0 puts each bucket in its object store, the
        actors fetch them from there.
    - ``driver``: the buckets are assembled here into one mapping (tied keys keep sharing a
      tensor) and handed to every engine (other engines or `WeightSource`s).

    The push is a version barrier, the only thing this process orders: every engine must
    report the same new version.

    Args:
        bucket_bytes: Size of one bucket streamed from the trainer.
        timeout_s: Longest wait for all engines to load the weights.
        transport: 'auto' (shared memory, else the object store, else this process),
            'collective' (a push group when every engine joins one, else as 'auto'),
            'object_store' (when every engine is a Ray actor, else as 'auto'; e.g. nodes of
            one machine that should not share its memory) or 'driver' (always through this
            process).
    """

    def __init__(
        self,
        bucket_bytes: int = 256 << 20,
        timeout_s: float = 600.0,
        *,
        transport: Literal["auto", "collective", "object_store", "driver"] = "auto",
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.transport = transport
        self._warned_transport = False
        self._members: tuple[int, ...] | None = None
        self.last_stats: SyncStats | None = None
        self._warned_adapter = False

    async def push(self, group: WeightSource, engines: Sequence[Engine]) -> list[int]:
        """Sends the current weights of ``group`` to ``engines``.

        Returns:
            The new policy version of each engine, all equal. Timings are in `last_stats`.

        Raises:
            WeightSyncError: An engine failed or timed out, or the versions differ.
        """
        if not engines:
            raise ValueError("push needs at least one engine")
        start = time.perf_counter()
        adapter = await self._adapter(group, engines)
        via = "adapter" if adapter is not None else self._direct_way(group, engines)
        if adapter is not None:
            tensors, nbytes, buckets = len(adapter.tensors), adapter.nbytes, 1
            loads = [engine.update_adapter(adapter) for engine in engines]
        elif via == "shared_memory":
            staged = await run_blocking(group.stage_weights, self.bucket_bytes)
            tensors, nbytes, buckets = staged.tensors, staged.nbytes, len(staged.paths)
            loads = [engine.update_shared_weights(staged) for engine in engines]
        elif via == "object_store":
            stored = await run_blocking(group.put_weights, self.bucket_bytes)
            tensors, nbytes, buckets = stored.tensors, stored.nbytes, len(stored.refs)
            loads = [engine.update_ray_weights(stored) for engine in engines]
        elif via == "collective":
            await self._join(group, engines)
            layouts = await run_blocking(group.bucket_layouts, self.bucket_bytes)
            tensors, buckets = sum(len(x.slots) for x in layouts), len(layouts)
            nbytes = sum(x.nbytes for x in layouts)
            loads = [engine.update_collective_weights(layouts) for engine in engines]
            sending = run_blocking(group.broadcast_weights, self.bucket_bytes)
        else:
            state, buckets = await self._collect(group)
            unique = {id(t): t for t in state.values()}.values()
            tensors, nbytes = len(state), sum(t.numel() * t.element_size() for t in unique)
            loads = [engine.update_weights(state) for engine in engines]
        gathered = time.perf_counter()
        if via == "collective":  # the engines receive while rank 0 sends
            loads.append(sending)
        try:
            versions = await asyncio.wait_for(asyncio.gather(*loads), self.timeout_s)
            versions = versions[: len(engines)]
        except TimeoutError as exc:
            raise WeightSyncError(
                f"engines did not load the new weights within {self.timeout_s:.0f}s"
            ) from exc
        except Exception as exc:
            raise WeightSyncError(f"an engine failed to load the new weights: {exc}") from exc
        if len(set(versions)) != 1:
            raise WeightSyncError(
                f"engines report different policy versions after the sync: {list(versions)}; "
                "they must start from the same version (restart the lagging ones)"
            )
        done = time.perf_counter()
        self.last_stats = SyncStats(
            version=versions[0],
            engines=len(engines),
            tensors=tensors,
            bytes=nbytes,
            buckets=buckets,
            gather_s=gathered - start,
            load_s=done - gathered,
            total_s=done - start,
            adapter=adapter is not None,
            via=via,
        )
        logger.info(
            "weight sync v%d: %.1f MB (%s) in %d buckets to %d engines in %.3fs "
            "(gather %.3fs, load %.3fs)",
            versions[0], self.last_stats.bytes / 1e6, via, buckets,
            len(engines),
            self.last_stats.total_s, self.last_stats.gather_s, self.last_stats.load_s,
        )  # fmt: skip
        return list(versions)

    async def _adapter(
        self, group: WeightSource, engines: Sequence[Engine]
    ) -> AdapterWeights | None:
        """The adapter to push alone, or None for merged weights."""
        get = getattr(group, "adapter_weights", None)
        adapter = None if get is None else await run_blocking(get)
        if adapter is None or all(map(_takes_adapters, engines)):
            return adapter
        if not self._warned_adapter:
            self._warned_adapter = True
            kinds = sorted({type(e).__name__ for e in engines if not _takes_adapters(e)})
            logger.warning(
                "lora.sync='adapter' but %s take no adapters: pushing merged weights", kinds
            )
        return None

    def _direct_way(self, group: WeightSource, engines: Sequence[Engine]) -> Via:
        """How full weights reach the engines from a `TrainerGroup` (see `WeightSync`)."""
        if self.transport == "driver" or not hasattr(group, "stage_weights"):
            return "driver"
        if self.transport == "collective":
            if all(getattr(engine, "takes_collective_weights", False) for engine in engines):
                return "collective"
            self._warn_transport("not every engine joins push groups (pools do not)")
        if self.transport == "object_store":
            if all(getattr(engine, "takes_ray_weights", False) for engine in engines):
                return "object_store"
            self._warn_transport("not every engine is a Ray actor")
        host = getattr(group, "staging_host", None)
        if all(
            isinstance(engine, SharedWeightsEngine) and engine.shared_weights_host == host
            for engine in engines
        ):
            return "shared_memory"
        if all(getattr(engine, "takes_ray_weights", False) for engine in engines):
            return "object_store"
        return "driver"

    def _warn_transport(self, why: str) -> None:
        if not self._warned_transport:
            self._warned_transport = True
            logger.warning("transport=%r but %s: choosing the way as 'auto' would",
                           self.transport, why)  # fmt: skip

    async def _join(self, group: WeightSource, engines: Sequence[Engine]) -> None:
        """Rank 0 and the engines form a push group, once per trainer and engine set (again
        after the trainer group was rebuilt: its rank 0 is a new process)."""
        members = (id(group), getattr(group, "restarts", 0), *map(id, engines))
        if members == self._members:
            return
        spec = await run_blocking(group.weight_group, len(engines))
        joins = [engine.join_weight_group(spec, rank) for rank, engine in enumerate(engines, 1)]
        try:
            await asyncio.wait_for(
                asyncio.gather(run_blocking(group.join_weight_group, spec), *joins), self.timeout_s
            )
        except Exception as exc:
            raise WeightSyncError(f"the engines did not join the push group: {exc!r}") from exc
        self._members = members

    async def _collect(self, group: WeightSource) -> tuple[Mapping[str, torch.Tensor], int]:
        """Drains the bucket stream off the event loop (each bucket is a blocking Ray get)."""
        stream = group.full_state_dict(self.bucket_bytes)
        state: dict[str, torch.Tensor] = {}
        buckets = 0
        try:
            while (bucket := await run_blocking(next, stream, None)) is not None:
                state.update(bucket)
                buckets += 1
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return state, buckets


def _takes_adapters(engine: object) -> bool:
    return isinstance(engine, AdapterEngine) and engine.takes_adapters
