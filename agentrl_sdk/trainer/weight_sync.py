"""`WeightSync`: the one path weights take from the trainer to the inference engines."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer.config import WEIGHT_SYNC_TIMEOUT_S
from agentrl_sdk.weights.push import (
    StateDict,
    WeightIntake,
    WeightKind,
    WeightPush,
    cast_floating,
    size_of,
)
from agentrl_sdk.weights.transports import TRANSPORTS, TransportName

if TYPE_CHECKING:
    import torch

__all__ = ["StateDictSource", "SyncStats", "Via", "WeightSource", "WeightSync", "WeightSyncError"]

Via = Literal["adapter", "shared_memory", "collective", "object_store", "driver"]
"""The way a push took (`WeightSync`)."""

VIA: dict[WeightKind, Via] = {
    "adapter": "adapter", "shared_files": "shared_memory", "collective": "collective",
    "object_refs": "object_store", "state_dict": "driver",
}  # fmt: skip
"""The way each push kind takes."""

logger = logging.getLogger(__name__)


class WeightSyncError(AgentRLError):
    """Engines did not all take the new weights (a failure, a timeout or diverging versions)."""


class WeightSource(Protocol):
    """Where pushes come from: `TrainerGroup` (and `AdapterGroup`), or anything that makes them.

    ``weight_offer`` says as data which push kinds it makes (and the host it stages files
    on); `export_weights` makes one; `send_weights` sends what flows while the engines load
    it (a broadcast's tensors; nothing for the other kinds).
    """

    @property
    def weight_offer(self) -> WeightIntake:
        """The kinds `export_weights` makes."""
        ...

    def export_weights(
        self, kind: WeightKind, bucket_bytes: int, audience: tuple[int, ...], dtype: str | None,
        changed_only: bool,
    ) -> WeightPush:
        """The current weights as a push of ``kind`` (blocking). ``audience`` identifies the
        receiving engines (a broadcast's push group is made anew when they change); full
        weights come with their floating tensors cast to ``dtype`` (the one every engine
        serves; None: as they are); with ``changed_only``, only the tensors that may differ
        from the model folder the engines loaded, as a ``partial`` push (or all of them)."""
        ...

    def send_weights(self, push: WeightPush) -> None:
        """Send the tensors of ``push`` that travel during the engines' load (blocking)."""
        ...


class StateDictSource:
    """A `WeightSource` over tensors this process holds (a model trained outside a
    `TrainerGroup`): every push hands them to the engines as a `StateDict`."""

    weight_offer = WeightIntake(frozenset({"state_dict"}))

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def export_weights(
        self, kind: WeightKind, bucket_bytes: int = 0, audience: tuple[int, ...] = (),
        dtype: str | None = None, changed_only: bool = False,
    ) -> StateDict:  # fmt: skip
        """The tensors as they are now, all of them (``kind`` is 'state_dict': the only one
        offered)."""
        return StateDict({k: cast_floating(t, dtype) for k, t in self.tensors.items()})

    def send_weights(self, push: WeightPush) -> None:
        """Nothing: the tensors travel in the push."""


@dataclass(frozen=True)
class SyncStats:
    """What one `WeightSync.push` did and how long each part took."""

    version: int
    engines: int
    tensors: int
    bytes: int
    buckets: int
    gather_s: float  # streaming the buckets out of the trainer
    load_s: float  # the engines' load_weights, concurrently
    total_s: float
    adapter: bool = False  # only LoRA adapter tensors moved (the engines merged them)
    via: Via = "driver"  # the way the weights took (see `WeightSync`)


class WeightSync:
    """Moves the trainer's weights to every engine as one `WeightPush`, the first kind that the
    source offers and every engine takes (`WeightIntake`), in this order:

    - ``adapter``: a LoRA trainer with ``lora.sync='adapter'`` (or a named adapter) sends
      its adapter alone.
    - Direct from a `TrainerGroup`, never through this process, whose memory does not grow
      with the model:
      - ``shared_files``: every engine maps files on the machine of the trainer's rank 0
        (torch engines here or in Ray actors there, vLLM): rank 0 writes the buckets to
        /dev/shm as it gathers them, each engine loads from there.
      - ``collective`` (only when asked, ``transport='collective'``): rank 0 and the engines'
        processes form a push group (NCCL on GPU, GPU to GPU as verl and OpenRLHF push to
        vLLM; gloo on CPU) and each bucket is broadcast. Every engine must join (Ray-actor
        engines, vLLM; not pools), and one dying mid-push stalls it until ``timeout_s``: the
        other ways isolate engine faults.
      - ``object_refs``: every engine is a Ray actor, some elsewhere (or
        ``transport='object_store'``): rank 0 puts each bucket in its object store, the
        actors fetch them from there.
    - ``state_dict``: the buckets are assembled here into one mapping (tied keys keep sharing
      a tensor) and handed to every engine.

    The driver assigns the version (the trainer updates the weights have seen); every engine
    must report it once loaded.

    Args:
        bucket_bytes: Size of one bucket streamed from the trainer.
        timeout_s: Longest wait for all engines to load the weights.
        changed_only: The engines started from the source's model folder (as a training job
            builds them): pushes carry only the tensors that may differ from it (the trained
            ones: the last layers, merged LoRA weights, what a checkpoint restored).
        transport: 'auto' (shared memory, else the object store, else this process),
            'collective' (a push group when every engine joins one, else as 'auto'),
            'object_store' (when every engine is a Ray actor, else as 'auto'; e.g. nodes of
            one machine that should not share its memory) or 'driver' (always through this
            process).
    """

    def __init__(
        self,
        bucket_bytes: int = 256 << 20,
        timeout_s: float = WEIGHT_SYNC_TIMEOUT_S,
        *,
        transport: TransportName = "auto",
        changed_only: bool = False,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.transport = transport
        self.changed_only = changed_only
        self._warned: set[str] = set()
        self.last_stats: SyncStats | None = None

    async def push(
        self, source: WeightSource, engines: Sequence[Engine], version: int
    ) -> SyncStats:
        """Sends the current weights of ``source`` to ``engines`` as ``version``.

        Returns:
            What the push did and how long it took (also in `last_stats`).

        Raises:
            WeightSyncError: An engine failed or timed out, reports another version, or no
                push kind suits both the source and every engine.
        """
        if not engines:
            raise ValueError("push needs at least one engine")
        if foreign := [type(e).__name__ for e in engines if not isinstance(e, Engine)]:
            raise WeightSyncError(
                f"{foreign} do not implement the Engine protocol: an engine takes weights "
                "through load_weights(push, version) and lists the kinds it takes in "
                "weight_intake (see agentrl_sdk.engines.Engine)"
            )
        start = time.perf_counter()
        intake = WeightIntake.common(engine.weight_intake for engine in engines)
        kind = self._kind(source.weight_offer, intake)
        push = await run_blocking(
            source.export_weights, kind, self.bucket_bytes, tuple(map(id, engines)), intake.dtype,
            self.changed_only,
        )  # fmt: skip
        gathered = time.perf_counter()
        loads = [engine.load_weights(push, version) for engine in engines]
        try:
            await asyncio.wait_for(
                asyncio.gather(*loads, run_blocking(source.send_weights, push)), self.timeout_s
            )
        except TimeoutError as exc:
            raise WeightSyncError(
                f"engines did not load the new weights within {self.timeout_s:.0f}s"
            ) from exc
        except Exception as exc:
            raise WeightSyncError(f"an engine failed to load the new weights: {exc}") from exc
        reported = [engine.policy_version for engine in engines]
        if any(v != version for v in reported):
            raise WeightSyncError(
                f"engines report policy versions {reported} after loading version {version}"
            )
        done = time.perf_counter()
        size = size_of(push)
        self.last_stats = SyncStats(
            version=version, engines=len(engines), tensors=size.tensors, bytes=size.nbytes,
            buckets=size.buckets, gather_s=gathered - start, load_s=done - gathered,
            total_s=done - start, adapter=kind == "adapter", via=VIA[kind],
        )  # fmt: skip
        logger.info(
            "weight sync v%d: %.1f MB (%s) in %d buckets to %d engines in %.3fs "
            "(gather %.3fs, load %.3fs)", version, size.nbytes / 1e6, VIA[kind], size.buckets,
            len(engines), done - start, gathered - start, done - gathered,
        )  # fmt: skip
        return self.last_stats

    def _kind(self, offer: WeightIntake, intake: WeightIntake) -> WeightKind:
        """The first kind of the preference order the source makes and every engine takes."""
        if "adapter" in offer.kinds:
            if intake.takes("adapter"):
                return "adapter"
            self._warn("adapter", "the source pushes adapters but some engines take none "
                       "(vLLM: set engine_args.enable_lora): pushing merged weights")  # fmt: skip
        wanted = TRANSPORTS[self.transport].kinds
        for kind in wanted:
            if offer.takes(kind, offer.shared_host) and intake.takes(kind, offer.shared_host):
                if kind != wanted[0] and self.transport != "auto":
                    self._warn(self.transport, f"transport={self.transport!r} but not every "
                               f"engine takes {wanted[0]!r} pushes: choosing as 'auto' would")
                return kind
        raise WeightSyncError(
            f"no push kind suits the source (it makes {sorted(offer.kinds)}) and every engine "
            f"(they all take {sorted(intake.kinds)})"
        )

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)
