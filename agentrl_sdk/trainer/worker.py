"""One rank of the policy trainer: an FSDP2-sharded causal LM, AdamW, and the globally normalised
PPO update. Runs inside a Ray actor (see `TrainerGroup`) but imports no Ray at module level.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from agentrl_sdk.algorithms import (
    PolicyLossConfig,
    aggregate,
    entropy_from_logits,
    importance_weights,
    kl_loss,
    micro_batch_share,
    ppo_policy_loss,
    sequence_mass,
    token_share,
)
from agentrl_sdk.engines.lora_weights import AdapterWeights, merged_weight
from agentrl_sdk.engines.shared_weights import host_id
from agentrl_sdk.engines.tensor_transport import PackedTensors
from agentrl_sdk.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.export import save_adapter_folder, save_merged_folder
from agentrl_sdk.trainer.lora import (
    ADAPTER,
    AdaptedWeight,
    activate_adapter,
    adapted_weights,
    adapter_file_key,
    adapters_disabled,
    engine_key,
    inject_lora,
    lora_dropout_active,
)
from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch, mini_batches, pack, shard_plan
from agentrl_sdk.trainer.weight_export import release_staged

if TYPE_CHECKING:
    from torch import nn

__all__ = ["PolicyWorker"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

# ppo_policy_loss metrics that are plain means over trained tokens (sequence weights ignored).
_TOKEN_MEAN_METRICS = ("clip_frac", "approx_kl", "ratio_mean", "entropy", "dual_clip_frac")


@dataclass(frozen=True)
class _Normalisers:
    """Batch-wide denominators, summed over all ranks, that make micro-batch losses add up."""

    loss_denominator: float  # sum_i w_i n_i (token-mean) or sum_i w_i [n_i > 0] (seq-mean)
    trained_tokens: float  # sum_i n_i, for the token-mean metrics
    padded_length: int  # longest response (the T of a normalised token sum)


@dataclass
class _AdapterState:
    """What one LoRA adapter trains with, while another adapter is active."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int
    updates: int
    adapted: dict[str, AdaptedWeight]


_PER_ADAPTER = frozenset({
    "update", "compute_logprobs", "gather_packed_adapter", "export_pretrained",
    "save_checkpoint", "load_checkpoint",
})  # fmt: skip
"""The calls `PolicyWorker.for_adapter` makes for one adapter."""


class PolicyWorker:
    """One rank: loads the model from a local folder, shards it with FSDP2, trains it with AdamW.

    Every rank receives the whole batch and derives its own share with the deterministic
    `shard_plan`, so no plan is exchanged. The loss of an optimizer step is
    ``ppo_policy_loss`` (+ KL, - entropy) over the whole mini-batch at once: each micro-batch's
    loss is scaled by its share of the batch-wide denominator (all-reduced over ranks) and the
    FSDP gradient reduction sums instead of averaging.

    The model stays in eval mode (dropout off), so recomputed and training logprobs agree.

    Args:
        rank: This worker's rank.
        world_size: Number of ranks.
        model_path: Local ``save_pretrained`` folder of the causal LM.
        config: Trainer options.
        loss_config: Loss options.
        adapters: With ``config.lora``, the names of the LoRA adapters to hold (several
            policies as adapters of one base: one PEFT adapter and one optimizer each, see
            `for_adapter`); empty: one adapter, ``"default"``.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        config: TrainerConfig,
        loss_config: PolicyLossConfig,
        adapters: Sequence[str] = (),
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.model_path = str(model_path)
        self.config = config
        self.loss_config = loss_config
        self.step = 0  # optimizer steps taken
        self.updates = 0  # update() calls
        self.device = torch.device("cpu")
        self.model: nn.Module | None = None
        self.ref_model: nn.Module | None = None
        self._adapted: dict[str, AdaptedWeight] = {}  # engine key -> its LoRA pieces
        self._trainer_keys: dict[str, str] = {}  # engine key -> trainer key (LoRA renames)
        if adapters and config.lora is None:
            raise ValueError(f"adapters {list(adapters)} need trainer.lora")
        self.adapters = tuple(adapters) or (ADAPTER,)
        self._active = self.adapters[0]  # its optimizer, schedule and counters are self's
        self._inactive: dict[str, _AdapterState] = {}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port on it, for rank 0 to host the rendezvous."""
        import ray

        # Outside Ray (a rank built by hand) the ranks share this machine; inside, every rank
        # must reach this node's address: no fallback that would hang a 2-node rendezvous.
        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return ip, s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Joins the process group, loads and shards the model(s), builds optimizer and schedule.

        Returns:
            ``rank``, ``device``, ``dtype`` and ``num_params`` (unsharded).
        """
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per rank and load is noise in the driver log
        cfg = self.config
        if os.nice(0) > 0:
            logger.warning(
                "trainer rank %d runs at nice %d (a Ray cluster started without "
                "RAY_worker_niceness=0): it yields the CPU to every other process",
                self.rank, os.nice(0),
            )
        if not torch.cuda.is_available():
            # Ray starts actors with one OMP thread whatever num_cpus says: use what was given.
            torch.set_num_threads(cfg.cpu_threads or max(1, int(cfg.num_cpus_per_worker)))
        _seed_all(cfg.seed + self.rank)
        backend = cfg.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=cfg.collective_timeout_s),
        )
        self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        self.compute_dtype = self._compute_dtype()
        self.model = self._load_sharded(trainable=True)
        self._trainer_keys = {
            name: key for key in self.model.state_dict() if (name := engine_key(key)) is not None
        }
        if self._wants_reference() and not self._adapted:
            # With LoRA the reference is the policy's own frozen base (adapters disabled).
            self.ref_model = self._load_sharded(trainable=False)
        self.optimizer, self.scheduler = self._new_optimizer(self._active)
        for name in self.adapters[1:]:
            optimizer, scheduler = self._new_optimizer(name)
            adapted = adapted_weights(self.model, name)
            self._inactive[name] = _AdapterState(optimizer, scheduler, 0, 0, adapted)
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self._placeholder = FlatSamples.placeholder(self.pad_id)
        num_params = sum(p.numel() for p in self.model.parameters())
        trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        lora = {}
        if self._adapted:
            transposed = sorted(k for k, a in self._adapted.items() if a.fan_in_fan_out)
            lora = {"lora_weights": len(self._adapted), "lora_fan_in_fan_out": transposed}
        return lora | {
            "rank": self.rank,
            "device": str(self.device),
            "dtype": str(self.compute_dtype).removeprefix("torch."),
            "num_params": num_params,
            "trained_params": trained,
            "threads": torch.get_num_threads(),
            "nice": os.nice(0),
            "node_id": _ray_node_id(),
            "host": host_id(),
            "pid": os.getpid(),
        }

    def _new_optimizer(
        self, adapter: str
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        """AdamW and its schedule over the trained parameters (``adapter``'s alone when the
        model holds several adapters)."""
        cfg = self.config
        several = len(self.adapters) > 1
        params = [
            p for name, p in self.model.named_parameters()
            if p.requires_grad and (not several or _adapter_of(name) == adapter)
        ]  # fmt: skip
        optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        # A plain lambda (not a bound method) keeps the scheduler's state_dict JSON-friendly.
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cfg.lr_factor(step))
        return optimizer, scheduler

    def for_adapter(self, adapter: str, method: str, *args: Any) -> Any:
        """``method(*args)`` for LoRA adapter ``adapter``: with it active in the forward and
        its own optimizer, schedule and counters (the first adapter is active again after).

        Raises:
            ValueError: The worker holds no such adapter, or ``method`` is not per adapter.
        """
        if adapter not in self.adapters or method not in _PER_ADAPTER:
            raise ValueError(
                f"for_adapter({adapter!r}, {method!r}): adapters are {list(self.adapters)}, "
                f"methods {sorted(_PER_ADAPTER)}"
            )
        previous = self._active
        self._switch(adapter)
        try:
            return getattr(self, method)(*args)
        finally:
            self._switch(previous)

    def _switch(self, adapter: str) -> None:
        if adapter == self._active:
            return
        self._inactive[self._active] = _AdapterState(
            self.optimizer, self.scheduler, self.step, self.updates, self._adapted
        )
        state = self._inactive.pop(adapter)
        self.optimizer, self.scheduler = state.optimizer, state.scheduler
        self.step, self.updates, self._adapted = state.step, state.updates, state.adapted
        activate_adapter(self.model, adapter)
        self._active = adapter

    def _compute_dtype(self) -> torch.dtype:
        if self.config.dtype == "float32":
            return torch.float32
        if self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            logger.warning("%s does not support dtype='bfloat16'; training in float32", self.device)
            return torch.float32
        return torch.bfloat16

    def _load_sharded(self, *, trainable: bool) -> nn.Module:
        """Loads the model in float32 and shards each decoder layer, then the root, with FSDP2."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        model = self._from_pretrained().to(self.device)
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        if not layers:
            raise ValueError(
                f"cannot find the decoder layers of {type(model).__name__} (its _no_split_modules "
                f"is {sorted(layer_classes)}); FSDP2 shards one unit per decoder layer"
            )
        if trainable and self.config.lora is not None:
            self._adapted = inject_lora(model, self.config.lora, self.config.seed, self.adapters)
        elif trainable:
            self._freeze(model, layers)
        if self.config.activation_checkpointing:
            for layer in layers:
                checkpoint_activations(layer)
        # Parameters (and so optimizer state) stay float32; bf16 is for compute only.
        mp = MixedPrecisionPolicy()
        if self.compute_dtype != torch.float32:
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mesh=self._mesh, mp_policy=mp)
        fully_shard(model, mesh=self._mesh, mp_policy=mp)
        model.eval()
        if trainable:
            # Each rank's loss is already its share of the global loss: sum the gradients
            # (plain SUM; gloo has no PREMUL_SUM, and a factor of 1 needs no scaling anyway).
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_gradient_divide_factor(1.0)
                    module.set_force_sum_reduction_for_comms(True)
        else:
            model.requires_grad_(False)
        return model

    def _from_pretrained(self) -> nn.Module:
        """The model of ``model_path`` in float32 (a subclass may load another head)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            self.model_path, local_files_only=True, dtype=torch.float32
        )

    def _freeze(self, model: nn.Module, layers: Sequence[nn.Module]) -> None:
        """Freezes what ``trainable_layers`` leaves out."""
        freeze_all_but_last(model, layers, self.config.trainable_layers)

    def _wants_reference(self) -> bool:
        """Whether a frozen KL reference model is needed."""
        return self.loss_config.kl_coef > 0

    # ---------------------------------------------------------------- logprobs

    def _logprobs(
        self, model: nn.Module, batch: PackedBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Response-token logprobs ``(B, T)`` at the configured temperature, and the scaled
        logits ``(B, T, V)`` they come from."""
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            logits_to_keep=batch.num_logits,
            use_cache=False,
        )
        logits = out.logits  # (B, K, V)
        # Row-wise indexing, not gather with a (B, T, V) expanded index: the same values and
        # gradients at a third of the CPU time.
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]  # (B, 1)
        scaled = logits[rows, batch.logit_index].float() / self.config.temperature  # (B, T, V)
        logp = scaled.log_softmax(-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        return logp, scaled

    def _packed(self, flat: FlatSamples, indices: Sequence[int]) -> PackedBatch:
        if not indices:
            return pack(self._placeholder, [0], self.pad_id).to(self.device)
        return pack(flat, indices, self.pad_id).to(self.device)

    @torch.no_grad()
    def compute_logprobs(self, flat: FlatSamples) -> np.ndarray:
        """Per-token logprobs of every response token under the current weights.

        Returns:
            A float32 array laid out like ``flat.response_ids``, 0.0 at mask-0 positions (the
            convention of ``Sample.old_logprobs``); identical on every rank.
        """
        return self._per_token(flat, lambda batch: self._logprobs(self.model, batch)[0])

    def _per_token(
        self, flat: FlatSamples, forward: Callable[[PackedBatch], torch.Tensor]
    ) -> np.ndarray:
        """``forward``'s (B, T) output for every response token of ``flat``, each rank
        computing its share (`shard_plan`), laid out like ``flat.response_ids`` with 0.0 at
        mask-0 positions; identical on every rank (a collective)."""
        plan = shard_plan(
            flat.lengths, range(len(flat)), self.world_size, self.config.micro_batch_tokens
        )
        out = np.zeros(len(flat.response_ids), dtype=np.float32)
        for indices in plan[self.rank]:
            values = forward(self._packed(flat, indices)).cpu().numpy()
            for row, i in enumerate(indices):
                span = flat.response_slice(i)
                out[span] = values[row, : span.stop - span.start]
        out *= flat.response_mask
        total = torch.from_numpy(out).to(self.device)
        dist.all_reduce(total)  # each position is nonzero on one rank at most
        return total.cpu().numpy()

    # ---------------------------------------------------------------- update

    def update(self, flat: FlatSamples) -> dict[str, float]:
        """``ppo_epochs`` passes over ``num_mini_batches`` mini-batches, one optimizer step each.

        Returns:
            Metrics averaged over the optimizer steps (``lr`` is the last step's), plus
            ``tokens``, ``trained_tokens``, ``samples``, ``optimizer_steps`` and ``step``.
        """
        cfg = self.config
        if len(flat) == 0:
            raise ValueError("update got an empty batch")
        flat, correction = self._prepared(flat)
        steps = [
            self._optimizer_step(flat, mini)
            for _ in range(cfg.ppo_epochs)
            for mini in mini_batches(len(flat), cfg.num_mini_batches)
        ]
        self.updates += 1
        metrics = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        metrics["lr"] = steps[-1]["lr"]
        metrics |= {
            "tokens": float(flat.lengths.sum()),
            "trained_tokens": float(flat.trained_tokens.sum()),
            "samples": float(len(flat)),
            "optimizer_steps": float(len(steps)),
            "step": float(self.step),
            "peak_rss_gb": _peak_rss_gb(),
        }
        return metrics | correction

    def _prepared(self, flat: FlatSamples) -> tuple[FlatSamples, dict[str, float]]:
        """The batch as the optimizer steps use it (recomputed or corrected old logprobs), and
        the metrics of that preparation."""
        if self.loss_config.correction != "none":
            return self._corrected(flat)
        if self.config.recompute_old_logprobs:
            return flat.with_old_logprobs(self.compute_logprobs(flat)), {}
        return flat, {}

    def _corrected(self, flat: FlatSamples) -> tuple[FlatSamples, dict[str, float]]:
        """The batch with proximal old logprobs (recomputed here) and the off-policy weights
        ``pi_prox / pi_behav`` of its recorded behaviour logprobs; identical on every rank."""
        lc = self.loss_config
        prox = self.compute_logprobs(flat)
        weights, metrics = importance_weights(
            torch.from_numpy(prox), torch.from_numpy(flat.old_logprobs),
            torch.from_numpy(flat.response_mask), lc.correction, lc.is_cap,
        )  # fmt: skip
        flat = flat.with_old_logprobs(prox).with_token_weights(weights.numpy())
        return flat, metrics

    def _metric_keys(self) -> list[str]:
        keys = ["loss", "pg_loss", "clip_frac", "approx_kl", "ratio_mean", "entropy"]
        if self.loss_config.clip_c is not None:
            keys.append("dual_clip_frac")
        if self.loss_config.kl_coef > 0:
            keys.append("kl")
        return keys

    def _optimizer_step(self, flat: FlatSamples, mini: list[int]) -> dict[str, float]:
        plan = shard_plan(flat.lengths, mini, self.world_size, self.config.micro_batch_tokens)
        mine = plan[self.rank]
        norm = self._normalisers(flat, [i for mb in mine for i in mb])
        sums = dict.fromkeys(self._metric_keys(), 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        with lora_dropout_active(self.model, self.config.lora is not None):
            for indices in mine:
                self._accumulate(flat, indices, norm, sums)
        grad_norm = self._clip_gradients()
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        totals = torch.tensor(list(sums.values()), dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        return dict(zip(sums, totals.tolist(), strict=True)) | {"grad_norm": grad_norm, "lr": lr}

    def _denominator(self, flat: FlatSamples, indices: Sequence[int]) -> float:
        """The aggregation's denominator over ``indices`` (see `aggregate`)."""
        idx = np.asarray(indices, dtype=np.int64)
        n = flat.trained_tokens[idx].astype(np.float64)
        w = flat.weights[idx].astype(np.float64)
        return float(sequence_mass(w, n, self.loss_config.agg).sum())

    def _normalisers(self, flat: FlatSamples, mine: list[int]) -> _Normalisers:
        idx = np.asarray(mine, dtype=np.int64)
        sums = torch.tensor(
            [self._denominator(flat, idx), float(flat.trained_tokens[idx].sum())],
            dtype=torch.float64,
            device=self.device,
        )
        longest = torch.tensor(
            [int(flat.response_lengths[idx].max(initial=1))], dtype=torch.int64, device=self.device
        )
        dist.all_reduce(sums)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        denominator, tokens = sums.tolist()
        return _Normalisers(denominator, tokens, int(longest.item()))

    def _accumulate(
        self, flat: FlatSamples, indices: list[int], norm: _Normalisers, sums: dict[str, float]
    ) -> None:
        """Forward/backward of one micro-batch, its loss scaled to its share of the step's loss."""
        lc = self.loss_config
        batch = self._packed(flat, indices)
        mask, weights = batch.response_mask, batch.weights
        share, token_share = self._shares(flat, indices, norm, mask)

        logp, scaled = self._logprobs(self.model, batch)
        if lc.entropy_coef > 0:
            entropy = entropy_from_logits(scaled)  # (B, T)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(scaled.detach())
        pg, metrics = ppo_policy_loss(
            logp, batch.old_logprobs, batch.advantages, mask,
            clip_low=lc.clip_low, clip_high=lc.clip_high, clip_c=lc.clip_c, agg=lc.agg,
            seq_weights=weights, entropy=entropy.detach(), token_weights=batch.token_weights,
        )  # fmt: skip
        loss = pg
        if lc.kl_coef > 0:
            with torch.no_grad():
                ref_logp = self._reference_logprobs(batch)
            kl, kl_metrics = kl_loss(logp, ref_logp, mask, lc.kl_kind, lc.agg, weights)
            loss = loss + lc.kl_coef * kl
            sums["kl"] += kl_metrics["kl"] * share
        if lc.entropy_coef > 0:
            loss = loss - lc.entropy_coef * aggregate(entropy, mask, lc.agg, weights)
        (loss * share).backward()
        sums["loss"] += loss.item() * share
        sums["pg_loss"] += metrics["pg_loss"] * share
        for key in _TOKEN_MEAN_METRICS:
            if key in sums:
                sums[key] += metrics[key] * token_share

    def _shares(
        self, flat: FlatSamples, indices: list[int], norm: _Normalisers, mask: torch.Tensor
    ) -> tuple[float, float]:
        """A micro-batch's share of the step's loss and of its trained tokens (the weight of
        its token-mean metrics)."""
        # share * (S_mb / d_mb) = S_mb / D: the micro-batch's part of the whole-batch loss.
        share = micro_batch_share(
            self._denominator(flat, indices), norm.loss_denominator, self.loss_config.agg,
            mask.shape[1], norm.padded_length,
        )  # fmt: skip
        return share, token_share(float(mask.sum()), norm.trained_tokens)

    def _reference_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """Logprobs under the KL reference: the initial weights, or the base under LoRA."""
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, batch)[0]
        with adapters_disabled(self.model):
            return self._logprobs(self.model, batch)[0]

    def _clip_gradients(self) -> float:
        max_norm = self.config.max_grad_norm or float("inf")
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(trained, max_norm)
        full = getattr(norm, "full_tensor", None)
        return float(full() if full is not None else norm)

    # ---------------------------------------------------------------- weights out

    def engine_tensors(self) -> list[tuple[list[str], torch.Tensor]]:
        """The engine's state dict as the trainer holds it: keys of the base model (adapters
        left out, a LoRA base under its plain name), tied keys grouped."""
        out = []
        for keys, tensor in _tensors_by_identity(self.model):
            names = [name for name in map(engine_key, keys) if name is not None]
            if names:
                out.append((names, tensor))
        return out

    def state_dict_plan(self, bucket_bytes: int) -> list[list[str]]:
        """Keys of the engine's full state dict cut into buckets of at most ``bucket_bytes``
        (unsharded). With LoRA these are the base model's keys, for merged weights.

        Tied parameters (one tensor under several keys) stay in one bucket; a tensor larger
        than the budget gets a bucket of its own. Identical on every rank.
        """
        buckets: list[list[str]] = []
        size = 0
        for keys, tensor in self.engine_tensors():
            nbytes = tensor.numel() * tensor.element_size()
            if buckets and size + nbytes <= bucket_bytes:
                buckets[-1].extend(keys)
                size += nbytes
            else:
                buckets.append(list(keys))
                size = nbytes
        return buckets

    def gather_bucket(
        self, keys: Sequence[str], state: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """All-gathers the engine weights ``keys`` (a collective: every rank must call it).

        A LoRA-adapted weight comes merged, ``W + scaling * B @ A``. ``state``: the model's
        ``state_dict(keep_vars=True)`` when the caller gathers several buckets (taken once).

        Returns:
            On rank 0, the full CPU tensors by key (tied keys share one tensor); else None.
        """
        if state is None:
            state = self.model.state_dict(keep_vars=True)
        gathered: dict[int, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            adapted = self._adapted.get(key)
            tensor = state[adapted.base if adapted else self._trainer_keys[key]]
            full = gathered.get(id(tensor))
            if full is None:
                full = self._full(tensor)
                if adapted is not None:
                    full = merged_weight(
                        full, self._full(state[adapted.lora_a]), self._full(state[adapted.lora_b]),
                        self.config.lora.scaling, adapted.fan_in_fan_out,
                    )  # fmt: skip
                gathered[id(tensor)] = full
            out[key] = full
        return out if self.rank == 0 else None

    @torch.no_grad()  # DTensor ops record no autograd graph: ~5x faster per tensor here
    def _full(self, tensor: torch.Tensor) -> torch.Tensor:
        """The unsharded tensor (a collective for a DTensor); on CPU on rank 0. Alone, the
        local shard is the whole tensor: a view of it, not a copy (callers copy it out)."""
        full = tensor
        if hasattr(full, "full_tensor"):
            local = full.to_local()
            full = local if local.shape == full.shape else full.full_tensor()
        full = full.detach()  # after to_local: detaching a DTensor is another dispatch
        return full.cpu() if self.rank == 0 else full

    def gather_adapter(self) -> dict[str, torch.Tensor] | None:
        """All-gathers the LoRA tensors (a collective). On rank 0 they come by the keys of
        PEFT's ``adapter_model.safetensors``; else None."""
        if self.config.lora is None:
            raise ValueError("gather_adapter needs trainer.lora (this trainer trains every weight)")
        state = self.model.state_dict(keep_vars=True)
        keys = [k for a in self._adapted.values() for k in (a.lora_a, a.lora_b)]
        out = {adapter_file_key(k, self._active): self._full(state[k]) for k in keys}
        return out if self.rank == 0 else None

    def gather_packed_adapter(self) -> PackedTensors | None:
        """`gather_adapter` as numpy arrays (rank 0)."""
        state = self.gather_adapter()
        return None if state is None else PackedTensors.pack(state)

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(self, *args)`` on this rank: the group's calls of functions that work on a rank
        (the weight exporters of `weight_export`) without being its methods."""
        return fn(self, *args)

    def export_pretrained(self, path: str, form: str | None = None) -> None:
        """Writes the current weights as a ``save_pretrained`` folder (rank 0), with the
        tokenizer and generation config of the model folder.

        With LoRA and ``form`` 'adapter' (default: ``lora.export``) the folder is a PEFT
        adapter on top of the model folder instead (plus its tokenizer); with 'merged' the
        adapters are merged into the weights.
        """
        lora = self.config.lora
        if lora is not None and (form or lora.export) == "adapter":
            self._export_adapter(path)
            return
        state = self.gather_bucket([k for keys, _ in self.engine_tensors() for k in keys])
        if self.rank == 0:
            save_merged_folder(path, self.model_path, state)
        dist.barrier()

    def _export_adapter(self, path: str) -> None:
        state = self.gather_adapter()
        if self.rank == 0:
            assert self.config.lora is not None  # only called with LoRA
            transposed = frozenset(k for k, a in self._adapted.items() if a.fan_in_fan_out)
            adapter = AdapterWeights(state, self.config.lora.scaling, transposed)
            save_adapter_folder(path, adapter, self.model_path)
        dist.barrier()

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        """Saves everything the next update depends on, plus ``extra`` (see `checkpoint`)."""
        save_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trained_only=self.config.lora is not None, trainer_state={
                "step": self.step, "updates": self.updates, "world_size": self.world_size,
                "extra": extra,
            },
        )  # fmt: skip

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restores a checkpoint (model and optimizer from any world size); returns ``extra``."""
        state = load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trained_only=self.config.lora is not None,
        )
        self.step, self.updates = state["step"], state["updates"]
        return state["extra"]

    def close(self) -> None:
        """Deletes the staged weights and leaves the process group."""
        release_staged()
        if dist.is_initialized():
            dist.destroy_process_group()


def freeze_all_but_last(model: nn.Module, layers: Sequence[nn.Module], count: int | None) -> None:
    """Leaves only the last ``count`` of ``layers`` and the final norm trainable (``None``: all).

    Embeddings and the LM head are often one tied tensor; both stay frozen, so the engine's
    vocabulary projection never moves and the optimizer holds no state for it.
    """
    if count is None:
        return
    if count > len(layers):
        raise ValueError(
            f"trainable_layers={count} but the model has {len(layers)} decoder layers"
        )
    model.requires_grad_(False)
    for layer in layers[len(layers) - count :]:
        layer.requires_grad_(True)
    norm = getattr(getattr(model, "model", model), "norm", None)
    if count and norm is not None:
        norm.requires_grad_(True)


def checkpoint_activations(layer: nn.Module) -> None:
    """Makes ``layer`` recompute its activations in the backward pass (non-reentrant).

    transformers' own gradient checkpointing acts only in train mode, and the policy stays in
    eval mode (no dropout), so the layer's forward is wrapped here instead.
    """
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layer.forward = recomputed  # type: ignore[method-assign]


def _adapter_of(name: str) -> str | None:
    """The LoRA adapter a parameter belongs to (``...lora_A.<adapter>.weight``), or None."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("lora_A", "lora_B"):
            return parts[i + 1]
    return None


def _tensors_by_identity(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """The state dict's tensors in order, each with all its keys (tied weights share one)."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), ([], tensor))[0].append(key)
    return list(groups.values())


def _peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _ray_node_id() -> str | None:
    """The Ray node this worker runs on (None outside Ray): where a multi-node job placed it."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
