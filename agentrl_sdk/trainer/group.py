"""`TrainerGroup`: ``world_size`` policy workers (Ray actors, or one in this process), driven by
broadcast calls; its weights leave through ``group.weights`` (`WeightExports`)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agentrl_sdk.algorithms import PolicyLossConfig
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.errors import RankDiedError, TrainerError
from agentrl_sdk.trainer.exports import WeightExports
from agentrl_sdk.trainer.packing import FlatSamples
from agentrl_sdk.trainer.ranks import RankSet
from agentrl_sdk.trainer.ray_cluster import check_resources, init_ray
from agentrl_sdk.trainer.replay import ReplayLog
from agentrl_sdk.trainer.sharded_model import ShardedRank
from agentrl_sdk.trainer.worker import PolicyWorker, on_adapter
from agentrl_sdk.types import Batch

__all__ = ["RankDiedError", "TrainerError", "TrainerGroup", "init_ray"]

logger = logging.getLogger(__name__)

MOVED_TO_WEIGHTS = {
    "weight_offer": "weight_offer", "export_weights": "export_weights",
    "send_weights": "send_weights", "full_state_dict": "full_state_dict",
    "staging_host": "staging_host", "stage_weights": "stage", "put_weights": "put",
    "adapter_weights": "adapter_weights", "adapter_state_dict": "adapter_state_dict",
}  # fmt: skip
"""The group's former weight methods, by their name on ``group.weights``."""


class TrainerGroup:
    """Starts ``world_size`` `PolicyWorker` ranks and drives them in lockstep (`RankSet`).

    Every public call is broadcast to all ranks (their collectives need each other) and waits
    at most ``call_timeout_s``. With ``placement: ray`` each rank is a Ray actor; Ray is
    initialised only if it is not already: on ``config.ray_address`` when given, else as a
    local cluster with this machine's cores. With ``placement: in_process`` the one rank lives
    in this process (`InProcessRank`) and Ray is not needed. The weights leave through
    ``weights`` (`WeightExports`, a `WeightSource`: ``WeightSync().push(group.weights, ...)``).

    Args:
        model_path: Local ``save_pretrained`` folder of the policy (also the KL reference).
        adapters: With ``trainer.lora``, several named LoRA adapters on the one base (several
            policies as adapters of one base): each trains with its own optimizer, through
            the ``adapter`` argument of the calls (see `AdapterGroup`); empty: one adapter.

    Raises:
        FileNotFoundError: ``model_path`` is not a folder.
        TrainerError: A worker failed to start.
    """

    worker_cls: type[ShardedRank] = PolicyWorker
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
        self.config = cfg = trainer_config or TrainerConfig()
        self.loss_config = loss_config or PolicyLossConfig()
        on_ray = cfg.placement == "ray"
        self._owns_ray = on_ray and init_ray(cfg)
        replay_log = ReplayLog(cfg.max_replay_updates, on_ray and cfg.max_restarts > 0)
        args = (str(self.model_path), cfg, self.loss_config, self.adapters)
        self.ranks = RankSet(self.worker_cls, cfg, args, replay_log)
        self.weights = WeightExports(self.ranks, cfg)
        """The group's weights as pushes (`WeightExports`)."""
        try:
            if on_ray:
                check_resources(cfg)
            self.ranks.start()
        except BaseException:
            self.shutdown()
            raise
        logger.info("trainer group ready: %d ranks (%s), %s", cfg.world_size, cfg.placement,
                    self.info)

    @property
    def info(self) -> dict[str, Any]:
        """Rank 0's setup info (device, dtype, host, parameter counts ...)."""
        return self.ranks.info

    @property
    def restarts(self) -> int:
        """Times the group was rebuilt after a rank died."""
        return self.ranks.restarts

    def __getattr__(self, name: str) -> Any:
        if name in MOVED_TO_WEIGHTS:
            raise AttributeError(
                f"TrainerGroup.{name} is now group.weights.{MOVED_TO_WEIGHTS[name]} (and a "
                "WeightSync pushes group.weights)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        ranks = self.ranks
        update = self.worker_cls.update
        per_rank = ranks.recovering(lambda: ranks.call(*on_adapter(adapter, update, flat)))
        ranks.replay_log.remember(adapter, flat)
        peak = max(m.pop("peak_rss_gb") for m in per_rank)
        return per_rank[0] | {"time_s": time.perf_counter() - start, "peak_rss_gb": peak,
                              "restarts": float(self.restarts)}

    def compute_logprobs(self, batch: Batch, adapter: str | None = None) -> list[list[float]]:
        """Logprobs of every response token under the current weights, per sample.

        Each list aligns with the sample's ``response_ids``; mask-0 positions hold 0.0, as in
        ``Sample.old_logprobs``. Logits are divided by ``TrainerConfig.temperature``.
        """
        return self._per_token(PolicyWorker.compute_logprobs, batch, adapter)

    def _per_token(
        self, method: Callable[..., np.ndarray], batch: Batch, adapter: str | None = None
    ) -> list[list[float]]:
        """The ranks' ``method`` (one value per response token, identical on every rank), per
        sample."""
        if not batch.samples:
            return []
        flat = FlatSamples.from_samples(batch.samples)
        ranks = self.ranks
        values: np.ndarray = ranks.recovering(
            lambda: ranks.call(*on_adapter(adapter, method, flat)))[0]  # fmt: skip
        return [values[flat.response_slice(i)].tolist() for i in range(len(flat))]

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
        ranks = self.ranks
        save = on_adapter(adapter, ShardedRank.save_checkpoint, folder, extra)
        ranks.recovering(lambda: ranks.call(*save))
        ranks.replay_log.checkpointed(adapter, folder)

    def load_checkpoint(
        self, path: str | os.PathLike[str], adapter: str | None = None
    ) -> dict[str, Any]:
        """Restores a checkpoint written by `save_checkpoint` (of the same ``adapter``);
        returns its ``extra`` dict."""
        folder = str(Path(path).resolve())
        extra = self.ranks.call(*on_adapter(adapter, ShardedRank.load_checkpoint, folder))[0]
        self.weights.forget_plans()  # it may have changed tensors the model folder holds
        self.ranks.replay_log.checkpointed(adapter, folder)
        return extra

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
        self.ranks.call(*on_adapter(adapter, PolicyWorker.export_pretrained, str(path), form))
        return path

    def shutdown(self) -> None:
        """Leaves the process group and stops the ranks (and Ray, if this group started it)."""
        if (ranks := self.__dict__.get("ranks")) is not None:
            ranks.stop()
        if self.__dict__.get("_owns_ray", False):
            import ray

            if ray.is_initialized():
                ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> TrainerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
