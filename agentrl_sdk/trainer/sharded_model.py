"""One rank's sharded model: process group, FSDP2 load and sharding, LoRA adapters and their
optimizers, the KL reference, full-weight gathering, export and checkpoints. What a rank trains
(`PolicyWorker`'s PPO objective, `ValueWorker`'s value loss) is not its concern.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from agentrl_sdk.allocator import keep_memory_lean
from agentrl_sdk.hardware import resolve_dtype
from agentrl_sdk.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.layers import (
    checkpoint_activations,
    freeze_all_but_last,
    store_frozen_in,
)
from agentrl_sdk.trainer.lora import (
    ADAPTER,
    AdaptedWeight,
    activate_adapter,
    adapted_weights,
    adapter_file_key,
    adapters_disabled,
    engine_key,
    inject_lora,
)
from agentrl_sdk.trainer.ray_cluster import ray_if_started, rendezvous_address
from agentrl_sdk.weights.adapters import merged_weight
from agentrl_sdk.weights.push import cast_floating
from agentrl_sdk.weights.shared_files import StagedFileSet, host_id
from agentrl_sdk.weights.tensor_transport import PackedTensors

if TYPE_CHECKING:
    from torch import nn

    from agentrl_sdk.trainer.packing import FlatSamples

__all__ = ["ShardedModel", "ShardedRank", "causal_lm"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

Freeze = Callable[["nn.Module", Sequence["nn.Module"], "int | None"], None]
"""``(model, decoder layers, trainable_layers)``: leaves trainable what should train."""


_ADAPTER_STATE = ("optimizer", "scheduler", "step", "updates", "_adapted")
"""What each LoRA adapter trains with: the active one's are the model's attributes, the others'
wait in ``_inactive`` (`switch`)."""


class ShardedModel:
    """One rank's model, loaded from a local folder, sharded with FSDP2 and trained with AdamW.

    With LoRA it holds the adapters ``adapters`` (several policies of one base: one PEFT adapter,
    optimizer, schedule and counters each, see `switch`); ``optimizer``, ``scheduler``, ``step``
    and ``updates`` are the active adapter's. The model stays in eval mode (dropout off), so
    recomputed and training logprobs agree.

    Args:
        loader: Builds the float32 model from ``model_path`` (default: the causal LM).
        freeze: Leaves trainable what should train, without LoRA (default: `freeze_all_but_last`).
        reference: Whether to hold a frozen KL reference (the base itself under LoRA).
        adapters: With ``config.lora``, the names of the LoRA adapters to hold; empty: one
            adapter, ``"default"``.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        config: TrainerConfig,
        *,
        loader: Callable[[str], nn.Module] | None = None,
        freeze: Freeze | None = None,
        reference: bool = False,
        adapters: Sequence[str] = (),
    ) -> None:
        keep_memory_lean()
        self.rank = rank
        self.world_size = world_size
        self.model_path = str(model_path)
        self.config = config
        self._loader = loader or causal_lm
        self._freeze = freeze or freeze_all_but_last
        self._reference = reference
        self.step = 0  # optimizer steps taken
        self.staged = StagedFileSet()  # rank 0's staged weight files (`exports.stage_buckets`)
        self.updates = 0  # updates (of the objective) made
        self.device = torch.device("cpu")
        self.model: nn.Module | None = None
        self.ref_model: nn.Module | None = None
        self._adapted: dict[str, AdaptedWeight] = {}  # engine key -> its LoRA pieces
        self._trainer_keys: dict[str, str] = {}  # engine key -> trainer key (LoRA renames)
        self._restored: set[str] = set()  # engine keys a checkpoint may have changed
        if adapters and config.lora is None:
            raise ValueError(f"adapters {list(adapters)} need trainer.lora")
        self.adapters = tuple(adapters) or (ADAPTER,)
        self.active = self.adapters[0]  # its optimizer, schedule and counters are self's
        self._inactive: dict[str, tuple[Any, ...]] = {}  # by adapter, its `_ADAPTER_STATE` values

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Joins the process group, loads and shards the model(s), builds optimizer and schedule;
        returns the rank's setup info (`RankSet.info`)."""
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
            # (In the job's process, `InProcessRank`, this sets the rank's own thread alone.)
            torch.set_num_threads(cfg.cpu_threads or max(1, int(cfg.num_cpus_per_worker)))
        seed = cfg.seed + self.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
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
        if self._reference and not self._adapted:
            # With LoRA the reference is the policy's own frozen base (adapters disabled).
            self.ref_model = self._load_sharded(trainable=False)
        self.optimizer, self.scheduler = self._new_optimizer(self.active)
        for name in self.adapters[1:]:
            adapted = adapted_weights(self.model, name)
            self._inactive[name] = (*self._new_optimizer(name), 0, 0, adapted)
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        lora, ray = {}, ray_if_started()
        if self._adapted:
            lora = {"lora_weights": len(self._adapted),
                    "lora_fan_in_fan_out": sorted(self.transposed)}
        return lora | {
            "rank": self.rank,
            "device": str(self.device),
            "dtype": str(self.compute_dtype).removeprefix("torch."),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            "trained_params": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            "threads": torch.get_num_threads(),
            "nice": os.nice(0),
            "node_id": ray.get_runtime_context().get_node_id() if ray else None,  # its placement
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

    def switch(self, adapter: str) -> None:
        """Makes LoRA adapter ``adapter`` the one the forward uses and the optimizer trains."""
        if adapter == self.active:
            return
        self._inactive[self.active] = tuple(getattr(self, name) for name in _ADAPTER_STATE)
        for name, value in zip(_ADAPTER_STATE, self._inactive.pop(adapter), strict=True):
            setattr(self, name, value)
        activate_adapter(self.model, adapter)
        self.active = adapter

    def _compute_dtype(self) -> torch.dtype:
        if resolve_dtype(self.config.dtype, self.device.type) == "float32":
            return torch.float32
        if self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            logger.warning("%s does not support dtype='bfloat16'; training in float32", self.device)
            return torch.float32
        return torch.bfloat16

    def _load_sharded(self, *, trainable: bool) -> nn.Module:
        """Loads the model in float32 and shards each decoder layer, then the root, with FSDP2."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        model = self._loader(self.model_path).to(self.device)
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
            self._freeze(model, layers, self.config.trainable_layers)
        if not trainable:
            model.requires_grad_(False)
        if self.config.lora is None:  # LoRA merges into its frozen base in float32
            store_frozen_in(model, self.compute_dtype)
        if self.config.activation_checkpointing:
            for layer in layers:
                checkpoint_activations(layer)
        # Trained parameters (and so optimizer state) stay float32; bf16 is for compute only.
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
        return model

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The KL reference to run forwards on: the initial weights, or the base under LoRA
        (the adapters disabled while inside)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with adapters_disabled(self.model):
            yield self.model

    def optimizer_step(self) -> dict[str, float]:
        """Clips the accumulated gradients, steps the optimizer and schedule; returns
        ``grad_norm`` (before clipping) and the ``lr`` the step used."""
        max_norm = self.config.max_grad_norm or float("inf")
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(trained, max_norm)
        full = getattr(norm, "full_tensor", None)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {"grad_norm": float(full() if full is not None else norm), "lr": lr}

    # ---------------------------------------------------------------- weights out

    def engine_tensors(self) -> list[tuple[list[str], torch.Tensor]]:
        """The engine's state dict as the trainer holds it: keys of the base model (adapters
        left out, a LoRA base under its plain name), tied keys grouped."""
        groups: dict[int, tuple[list[str], torch.Tensor]] = {}
        for key, tensor in self.model.state_dict(keep_vars=True).items():
            if (name := engine_key(key)) is not None:
                groups.setdefault(id(tensor), ([], tensor))[0].append(name)
        return list(groups.values())

    def changed_keys(self) -> set[str]:
        """Engine keys whose values may differ from the model folder's: trained parameters,
        LoRA-adapted weights (merged), and what a checkpoint restored."""
        keys = self._restored | self._adapted.keys()
        return keys.union(*(names for names, t in self.engine_tensors() if t.requires_grad))

    def gather_bucket(
        self, keys: Sequence[str], state: Mapping[str, torch.Tensor] | None = None,
        dtype: str | None = None,
    ) -> dict[str, torch.Tensor] | None:  # fmt: skip
        """All-gathers the engine weights ``keys`` (a collective: every rank must call it).

        A LoRA-adapted weight comes merged, ``W + scaling * B @ A``. ``state``: the model's
        ``state_dict(keep_vars=True)`` when the caller gathers several buckets (taken once).
        ``dtype``: floating tensors cast to it, as the engines serve them (None: float32).
        On rank 0, returns the full CPU tensors by key (tied keys share one tensor); else None.
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
                if self.rank == 0:
                    full = cast_floating(full, dtype)
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
        out = {adapter_file_key(k, self.active): self._full(state[k]) for k in keys}
        return out if self.rank == 0 else None

    @property
    def transposed(self) -> frozenset[str]:
        """Engine keys of the active adapter's transposed (``fan_in_fan_out``) weights."""
        return frozenset(k for k, a in self._adapted.items() if a.fan_in_fan_out)

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        """Saves everything the next update depends on, plus ``extra`` (see `checkpoint`)."""
        save_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trained_only=self.config.lora is not None, trainer_state={
                "step": self.step, "updates": self.updates, "world_size": self.world_size,
                "changed_keys": sorted(self.changed_keys()), "extra": extra,
            },
        )  # fmt: skip

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restores a checkpoint (model and optimizer from any world size); returns ``extra``."""
        state = load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trained_only=self.config.lora is not None,
        )
        self.step, self.updates = state["step"], state["updates"]
        if self.config.lora is None:  # the whole model came back (an older checkpoint: all)
            every = {k for keys, _ in self.engine_tensors() for k in keys}
            self._restored |= set(state.get("changed_keys", every))
        return state["extra"]

    def close(self) -> None:
        """Deletes the staged weights and leaves the process group."""
        self.staged.release()
        if dist.is_initialized():
            dist.destroy_process_group()


class ShardedRank:
    """A trainer rank (`PolicyWorker`, `ValueWorker`): its `ShardedModel` (``sharded``) and the
    objective it trains. The group reaches a rank only through `run`, naming each call by the
    function itself (``ranks.call(PolicyWorker.update, flat)``), so a renamed method fails its
    callers' type check, not a remote call at run time."""

    sharded: ShardedModel

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(self, *args)`` on this rank: a method of the rank's class, or a function of a
        rank (the weight exporters of `exports`)."""
        return fn(self, *args)

    def update(self, flat: FlatSamples) -> dict[str, float]:
        """One update of the rank's objective on ``flat``; its metrics."""
        raise NotImplementedError

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it, for rank 0 to host a rendezvous."""
        return rendezvous_address()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Joins the process group, loads and shards the model (`ShardedModel.setup`)."""
        return self.sharded.setup(master_addr, master_port)

    def gather_packed_adapter(self) -> PackedTensors | None:
        """The LoRA adapter as numpy arrays, on rank 0 (`ShardedModel.gather_adapter`)."""
        state = self.sharded.gather_adapter()
        return None if state is None else PackedTensors.pack(state)

    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        """`ShardedModel.save_checkpoint`."""
        self.sharded.save_checkpoint(path, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """`ShardedModel.load_checkpoint`; the checkpoint's ``extra``."""
        return self.sharded.load_checkpoint(path)

    def close(self) -> None:
        """Deletes the staged weights and leaves the process group."""
        self.sharded.close()


def causal_lm(path: str) -> nn.Module:
    """The causal LM of the ``save_pretrained`` folder ``path``, in float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)


def _adapter_of(name: str) -> str | None:
    """The LoRA adapter a parameter belongs to (``...lora_A.<adapter>.weight``), or None."""
    parts = name.split(".")
    pairs = zip(parts, parts[1:])
    return next((after for part, after in pairs if part in ("lora_A", "lora_B")), None)
