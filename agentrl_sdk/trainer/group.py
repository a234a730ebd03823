"""`TrainerGroup`: ``world_size`` policy workers (Ray actors, or one in this process), driven by
broadcast calls."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from agentrl_sdk.algorithms import PolicyLossConfig
from agentrl_sdk.engines.lora_weights import AdapterWeights
from agentrl_sdk.engines.ray_weights import RayWeights
from agentrl_sdk.engines.shared_weights import SharedWeights
from agentrl_sdk.engines.tensor_transport import PackedTensors
from agentrl_sdk.engines.weights import WeightIntake, WeightKind, WeightPush
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.errors import RankDiedError, TrainerError
from agentrl_sdk.trainer.packing import FlatSamples
from agentrl_sdk.trainer.in_process import InProcessRank
from agentrl_sdk.trainer.ranks import Ranks
from agentrl_sdk.trainer.ray_cluster import RayRanks, check_resources, init_ray, ray_if_started
from agentrl_sdk.trainer.replay import ReplayLog
from agentrl_sdk.trainer.weight_export import WeightExports
from agentrl_sdk.trainer.worker import PolicyWorker
from agentrl_sdk.types import Batch

_T = TypeVar("_T")

if TYPE_CHECKING:
    import torch

__all__ = ["RankDiedError", "TrainerError", "TrainerGroup", "init_ray"]

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 256 << 20
"""Default size of one weight bucket streamed out of the trainer."""


class TrainerGroup:
    """Starts ``world_size`` `PolicyWorker` ranks and drives them in lockstep.

    Every public call is broadcast to all ranks (their collectives need each other) and waits
    at most ``call_timeout_s``. With ``placement: ray`` each rank is a Ray actor; Ray is
    initialised only if it is not already: on ``config.ray_address`` when given, else as a
    local cluster with this machine's cores. With ``placement: in_process`` the one rank lives
    in this process (`InProcessRank`) and Ray is not needed.

    Args:
        model_path: Local ``save_pretrained`` folder of the policy (also the KL reference).
        trainer_config: Trainer options; defaults when None.
        loss_config: Loss options; defaults when None.
        adapters: With ``trainer.lora``, several named LoRA adapters on the one base (several
            policies as adapters of one base): each trains with its own optimizer, through
            the ``adapter`` argument of the calls (see `AdapterGroup`); empty: one adapter.

    Raises:
        FileNotFoundError: ``model_path`` is not a folder.
        TrainerError: A worker failed to start.
    """

    worker_cls: type = PolicyWorker
    """The class of the ranks (`agentrl_sdk.trainer.critic.CriticGroup` runs value workers)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        trainer_config: TrainerConfig | None = None,
        loss_config: PolicyLossConfig | None = None,
        adapters: Sequence[str] = (),
    ) -> None:
        self.model_path = Path(model_path).resolve()
        self.adapters = tuple(adapters)
        # Views of one adapter each (`AdapterGroup`) call from several threads at once: their
        # calls must reach every rank in the same order.
        self.lock = threading.RLock()
        if not self.model_path.is_dir():
            raise FileNotFoundError(
                f"{self.model_path} is not a local model folder; the trainer never downloads, "
                "so write one with save_pretrained() first"
            )
        self.config = trainer_config or TrainerConfig()
        self.loss_config = loss_config or PolicyLossConfig()
        self._exports = WeightExports(self)
        on_ray = self.config.placement == "ray"
        self._owns_ray = on_ray and init_ray(self.config)
        self.replay_log = ReplayLog(
            self.config.max_replay_updates, on_ray and self.config.max_restarts > 0
        )
        self.restarts = 0
        if on_ray:
            try:
                check_resources(self.config)
            except TrainerError:
                self.shutdown()
                raise
        self._start_workers()

    def _start_workers(self) -> None:
        """Start the ranks, rendezvous, and load the model in each."""
        cfg = self.config
        args = (str(self.model_path), cfg, self.loss_config, self.adapters)
        if cfg.placement == "in_process":
            self._ranks: Ranks | None = InProcessRank(self.worker_cls, args)
        else:
            self._ranks = RayRanks(self.worker_cls, cfg, args)
        try:
            address = self._submit("rendezvous_address", first_only=True)
            ip, port = self._wait(address, "start", cfg.init_timeout_s)[0]
            if ip == _node_ip():
                ip = "127.0.0.1"  # rank 0 shares the driver's node: stay on loopback
            ranks = self._call("setup", ip, port, timeout=cfg.init_timeout_s)
            self.info = ranks[0]
            self.node_ids: list[str | None] = [r["node_id"] for r in ranks]
            """The Ray node of each rank."""
            self.pids: list[int] = [r["pid"] for r in ranks]
            """The process of each rank."""
        except BaseException:
            self.shutdown()
            raise
        logger.info("trainer group ready: %d ranks (%s), %s", cfg.world_size, cfg.placement,
                    self.info)

    # ------------------------------------------------------------------ public API

    def update(self, batch: Batch, adapter: str | None = None) -> dict[str, float]:
        """One policy update on ``batch`` (``ppo_epochs`` x ``num_mini_batches`` optimizer steps),
        of LoRA adapter ``adapter`` when the group holds several.

        Returns:
            ``loss``, ``pg_loss``, ``clip_frac``, ``approx_kl``, ``ratio_mean``, ``entropy``
            (``kl``, ``dual_clip_frac`` when enabled), ``grad_norm``, ``lr``, ``tokens``,
            ``trained_tokens``, ``samples``, ``samples_skipped`` (without signal, so left out of
            the passes: no KL or entropy term), ``optimizer_steps``, ``step``, ``time_s``,
            ``peak_rss_gb`` (the largest peak resident memory of any rank so far) and
            ``restarts`` (times the group was rebuilt after a rank died).
        """

        if not batch.samples:
            raise ValueError("update needs a batch with at least one sample")
        start = time.perf_counter()
        flat = FlatSamples.from_samples(batch.samples)
        # The batch goes as a plain argument: Ray inlines small ones and stores large ones
        # itself. (An explicit ray.put from the SDK's threads once crashed Ray's driver on
        # an object-id check in CI, with two trainer groups putting at once.)
        per_rank = self._recovering(lambda: self._call(*_on(adapter, "update", flat)))
        self.replay_log.remember(adapter, flat)
        peak = max(m.pop("peak_rss_gb") for m in per_rank)
        return per_rank[0] | {"time_s": time.perf_counter() - start, "peak_rss_gb": peak,
                              "restarts": float(self.restarts)}

    def compute_logprobs(self, batch: Batch, adapter: str | None = None) -> list[list[float]]:
        """Logprobs of every response token under the current weights, per sample.

        Each list aligns with the sample's ``response_ids``; mask-0 positions hold 0.0, as in
        ``Sample.old_logprobs``. Logits are divided by ``TrainerConfig.temperature``.
        """

        return self._per_token("compute_logprobs", batch, adapter)

    def _per_token(
        self, method: str, batch: Batch, adapter: str | None = None
    ) -> list[list[float]]:
        """The ranks' ``method`` (one value per response token, identical on every rank), per
        sample."""
        if not batch.samples:
            return []
        flat = FlatSamples.from_samples(batch.samples)
        values: np.ndarray = self._recovering(lambda: self._call(*_on(adapter, method, flat)))[0]
        return [values[flat.response_slice(i)].tolist() for i in range(len(flat))]

    # ------------------------------------------------------------------ weights out

    @property
    def weight_offer(self) -> WeightIntake:
        """The push kinds `export_weights` makes (see `WeightExports.offer`)."""
        return self._exports.offer()

    def export_weights(
        self, kind: WeightKind, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        audience: tuple[int, ...] = (), dtype: str | None = None, changed_only: bool = False,
    ) -> WeightPush:  # fmt: skip
        """The current weights as a push of ``kind`` (`WeightSource`; see `WeightExports`)."""
        return self._exports.export(kind, bucket_bytes, audience, dtype, changed_only)

    def send_weights(self, push: WeightPush) -> None:
        """Broadcast a collective push's tensors from rank 0 (`WeightSource`)."""
        self._exports.send(push)

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
        return self._exports.stream(bucket_bytes, dtype, changed_only)

    @property
    def staging_host(self) -> str:
        """The host (`host_id`) whose shared memory `stage_weights` writes to: rank 0's."""
        return self.info["host"]

    def stage_weights(
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
        return self._exports.stage(bucket_bytes, dtype, changed_only)

    def put_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: str | None = None,
        changed_only: bool = False,
    ) -> RayWeights:  # fmt: skip
        """Puts the full weights in rank 0's object store, a Ray object per bucket; only the
        references come here. The objects live while a reference does (and rank 0)."""
        return self._exports.put(bucket_bytes, dtype, changed_only)

    def adapter_state_dict(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        """The full LoRA tensors (``trainer.lora`` only), by the keys of PEFT's
        ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight``)."""
        packed: PackedTensors = self._call(*_on(adapter, "gather_packed_adapter"))[0]
        return packed.unpack()

    def adapter_weights(self, adapter: str | None = None) -> AdapterWeights | None:
        """The adapter as a push carries it when ``trainer.lora.sync`` is 'adapter' (see
        `WeightSync`); None otherwise (a push sends merged weights). A named ``adapter`` (one
        of several) always goes as itself, named: the engine serves it beside the others."""
        lora = self.config.lora
        if lora is None or (lora.sync != "adapter" and adapter is None):
            return None
        transposed = frozenset(self.info.get("lora_fan_in_fan_out", ()))
        tensors = self.adapter_state_dict(adapter)
        return AdapterWeights(tensors, lora.scaling, transposed, name=adapter)

    def save_checkpoint(
        self,
        path: str | os.PathLike[str],
        extra: dict[str, Any] | None = None,
        adapter: str | None = None,
    ) -> None:
        """Saves model, optimizer, schedule, step, RNG states and ``extra`` to folder ``path``.

        ``extra`` (e.g. the data position) must be JSON-serialisable; it comes back from
        `load_checkpoint`. The folder must be visible to every worker (a shared file system
        on a multi-node cluster).
        """
        extra = dict(extra or {})
        try:
            json.dumps(extra)
        except TypeError as exc:
            raise TypeError(f"save_checkpoint: extra must be JSON-serialisable ({exc})") from exc
        folder = str(Path(path).resolve())
        self._recovering(lambda: self._call(*_on(adapter, "save_checkpoint", folder, extra)))
        self.replay_log.checkpointed(adapter, folder)

    def load_checkpoint(
        self, path: str | os.PathLike[str], adapter: str | None = None
    ) -> dict[str, Any]:
        """Restores a checkpoint written by `save_checkpoint` (of the same ``adapter``);
        returns its ``extra`` dict."""
        folder = str(Path(path).resolve())
        extra = self._call(*_on(adapter, "load_checkpoint", folder))[0]
        self._exports.forget_plans()  # it may have changed tensors the model folder holds
        self.replay_log.checkpointed(adapter, folder)
        return extra

    def _recovering(self, call: Callable[[], _T]) -> _T:
        """``call()``; when a rank dies, rebuild the group in the state before it (at most
        ``max_restarts`` times in all) and call again."""
        while True:
            try:
                return call()
            except RankDiedError as exc:
                self.replay_log.check(exc)
                if self.restarts >= self.config.max_restarts:
                    raise TrainerError(
                        f"{exc}; the group was already rebuilt {self.restarts} time(s) "
                        f"(trainer.max_restarts): resume from the last checkpoint"
                    ) from exc
                logger.warning("%s: rebuilding the trainer group (restart %d of %d)", exc,
                               self.restarts + 1, self.config.max_restarts)
                self._rebuild()

    def _rebuild(self) -> None:
        """New workers in the state of the old ones: the last checkpoint (or the model), then
        every update made since, replayed on the same batches."""

        self.restarts += 1
        self._stop_workers(graceful=False)  # survivors may be stuck in a collective
        self._start_workers()
        self.replay_log.replay(lambda adapter, *call: self._call(*_on(adapter, *call)))

    def export_pretrained(
        self,
        path: str | os.PathLike[str],
        form: Literal["merged", "adapter"] | None = None,
        adapter: str | None = None,
    ) -> Path:
        """Writes the current policy as a ``save_pretrained`` folder with the tokenizer of
        ``model_path``, loadable by ``TorchEngine.from_pretrained``. Returns the folder.

        With ``trainer.lora``, ``form`` (default ``lora.export``) chooses merged weights or a
        PEFT adapter folder (``PeftModel.from_pretrained(base, path)``; vLLM's LoRA loader).
        """
        path = Path(path).resolve()
        self._call(*_on(adapter, "export_pretrained", str(path), form))
        return path

    def shutdown(self) -> None:
        """Leaves the process group and stops the ranks (and Ray, if this group started it)."""
        self._stop_workers()
        if getattr(self, "_owns_ray", False):
            import ray

            if ray.is_initialized():
                ray.shutdown()
            self._owns_ray = False

    def _stop_workers(self, graceful: bool = True) -> None:
        ranks, self._ranks = getattr(self, "_ranks", None), None
        if ranks is not None:
            ranks.stop(graceful)

    def __enter__(self) -> TrainerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ broadcast plumbing

    def _submit(self, method: str, *args: Any, first_only: bool = False) -> list[Any]:
        """Starts ``method(*args)`` on every rank (rank 0 alone with ``first_only``); returns
        one handle per rank, for `_wait`."""
        if self._ranks is None:
            raise TrainerError(f"{method}: the trainer group is shut down")
        return self._ranks.submit(method, *args, first_only=first_only)

    def _wait(self, handles: list[Any], method: str, timeout: float | None = None) -> list[Any]:
        """The results of `_submit`'s ``handles`` in rank order, within ``timeout`` (default
        ``call_timeout_s``); a failure raises `TrainerError` (`RankDiedError` for a dead rank)."""
        assert self._ranks is not None
        return self._ranks.wait(handles, method, timeout or self.config.call_timeout_s)

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Runs ``method(*args)`` on every rank; returns the results in rank order."""
        return self._wait(self._submit(method, *args), method, timeout)


def _node_ip() -> str | None:
    """This node's IP in Ray's eyes (None without Ray)."""
    ray = ray_if_started()
    return ray.util.get_node_ip_address() if ray else None


def _on(adapter: str | None, method: str, *args: Any) -> tuple[Any, ...]:
    """`TrainerGroup._call` arguments of ``method(*args)``, for LoRA ``adapter`` if named."""
    if adapter is None:
        return (method, *args)
    return ("for_adapter", adapter, method, *args)
