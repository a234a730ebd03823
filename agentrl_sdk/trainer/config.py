"""`TrainerConfig`: how the policy workers are placed, sharded, optimised and fed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentrl_sdk.algorithms.schedule import warmup_cosine
from agentrl_sdk.algorithms.value import ValueLossConfig
from agentrl_sdk.config import ConfigSection
from agentrl_sdk.weights.transports import TRANSPORTS, TransportName

__all__ = ["WEIGHT_SYNC_TIMEOUT_S", "CriticConfig", "LoraConfig", "TrainerConfig"]

WEIGHT_SYNC_TIMEOUT_S = 600.0
"""Default longest wait for one weight push (`TrainerConfig.weight_sync_timeout_s`)."""


class LoraConfig(ConfigSection, frozen=True):
    """LoRA adapters on a frozen base (PEFT's LoRA, sharded by FSDP2 with the base).

    Only the adapters get gradients and optimizer state, so checkpoints hold adapters and
    optimizer state only; engines receive merged weights (base + adapter) or the adapter alone
    (``sync``).
    """

    rank: int = Field(8, ge=1, description="Rank r of each adapter (the inner size of B @ A).")
    alpha: float = Field(
        16.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank."
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the adapters' input, in training forwards "
        "only (recomputed logprobs and the engines never drop)."
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names (suffixes, as PEFT matches them) that get "
        "adapters, e.g. ['q_proj', 'v_proj']; 'all-linear' is every linear layer but the LM head."
    )
    sync: Literal["merged", "adapter"] = Field(
        "merged", description="What a weight sync moves: merged weights (base + adapter; any "
        "engine), or the adapter tensors only, which engines that take adapters (TorchEngine) "
        "merge into their own base copy; other engines still get merged weights."
    )
    export: Literal["merged", "adapter"] = Field(
        "merged", description="What final_model holds: a normal HF folder with the adapters "
        "merged into the base, or a PEFT adapter folder (adapter_config.json and "
        "adapter_model.safetensors, loadable by PEFT and vLLM) on top of the base model."
    )

    @property
    def scaling(self) -> float:
        """The factor of ``B @ A`` in the merged weight ``W + scaling * B @ A``."""
        return self.alpha / self.rank


class TrainerConfig(ConfigSection, frozen=True):
    """Options of the distributed policy trainer (FSDP2 workers on Ray).

    The loss itself (clipping, aggregation, KL and entropy coefficients) is configured apart, in
    `agentrl_sdk.algorithms.PolicyLossConfig`.
    """

    # Placement and communication.
    placement: Literal["ray", "in_process"] = Field(
        "ray", description="Where the ranks run. 'ray': each rank a Ray actor, a process of its "
        "own (any world size, several nodes, a dead rank is rebuilt: max_restarts). "
        "'in_process': world_size 1 in the job's own process, no Ray: on a laptop it saves the "
        "rank's own runtime, Ray's processes and a copy of each batch (~1 GB with SmolLM2), "
        "but a crash of the trainer ends the job, and a job has one such trainer (no critic "
        "or second trained policy beside it)."
    )
    world_size: int = Field(1, ge=1, description="Number of policy workers (ranks, one per actor).")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto is NCCL when CUDA is available, "
        "else gloo (CPU)."
    )
    num_cpus_per_worker: float = Field(
        1.0, gt=0, description="CPUs Ray reserves for each worker; a CPU worker runs that many "
        "torch threads (at least one)."
    )
    cpu_threads: int | None = Field(
        None, ge=1, description="torch threads of a CPU worker; None: num_cpus_per_worker, "
        "except in the sync pipeline of a local Ray, where CPU workers train on every usable "
        "core (split between them): the engine is idle while they train."
    )
    num_gpus_per_worker: float = Field(
        0.0, ge=0, description="GPUs Ray reserves for each worker; 0 trains on CPU."
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each worker reserves: pins the "
        "workers to the nodes that offer them (e.g. {trainer_node: 1} with `ray start "
        "--resources='{\"trainer_node\": 8}'` on the trainer nodes)."
    )
    ray_address: str | None = Field(
        None, description="Address of a running Ray cluster; None starts a local one (when Ray "
        "is not initialised yet)."
    )
    dtype: Literal["float32", "bfloat16", "prefer-bfloat16"] = Field(
        "float32", description="Compute dtype. bfloat16 uses FSDP2 mixed precision (trained "
        "parameters and optimizer state stay float32, gradients are reduced in float32); "
        "prefer-bfloat16: bfloat16 where the hardware computes it natively (CPUs with "
        "AVX512-BF16 or AMX, bf16 GPUs), float32 elsewhere (see agentrl_sdk.hardware)."
    )
    trainable_layers: int | None = Field(
        None, ge=0, description="Train only the last N decoder layers and the final norm; "
        "embeddings, the LM head and earlier layers stay frozen (no gradients, no optimizer "
        "state). None trains every parameter. On a CPU the last few layers of a small model "
        "cost about half of a full update."
    )
    lora: LoraConfig | None = Field(
        None, description="Train LoRA adapters on a frozen base instead of every parameter; "
        "None is full fine-tuning."
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass "
        "instead of keeping them: less memory for ~30% more compute."
    )
    # Optimiser and schedule.
    lr: float = Field(1e-6, gt=0, description="Peak AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2).")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="Learning rate after warmup: constant, or cosine decay to "
        "min_lr_ratio * lr at total_steps."
    )
    warmup_steps: int = Field(
        0, ge=0, description="Optimizer steps of linear warmup: step s uses "
        "lr * (s + 1) / warmup_steps."
    )
    total_steps: int | None = Field(
        None, ge=1, description="Optimizer steps of the whole run; required by the cosine schedule."
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Floor of the cosine schedule, as a fraction of lr."
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this value; None only reports it."
    )
    # Batching and the update.
    micro_batch_tokens: int = Field(
        8192, ge=1, description="Token budget of one forward/backward, padding included "
        "(rows * longest row), or the tokens laid out with share_prefix; gradients are "
        "accumulated over micro-batches. A sample longer than the budget runs alone."
    )
    share_prefix: bool = Field(
        False, description="Run a micro-batch as one sequence laid out as a prefix tree: "
        "what its samples share (system prompt, tool schema, a group's question, a rollout "
        "tree's trunk of replies and tool outputs) once, then each sample's own tokens, "
        "without padding; samples that share most are put in one micro-batch. The same loss "
        "and gradients up to float rounding, for a fraction of the compute when samples are "
        "long and alike."
    )
    temperature: float = Field(
        1.0, gt=0, description="Logits are divided by it before logprobs are computed. In a "
        "training job it is the rollout sampling temperature (derived; setting it to another "
        "value is refused), so trainer and engine logprobs agree."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch per update call.")
    num_mini_batches: int = Field(
        1, ge=1, description="Optimizer steps per epoch: the batch is cut into this many "
        "contiguous mini-batches."
    )
    recompute_old_logprobs: bool = Field(
        False, description="Recompute old logprobs with the trainer's weights before the first "
        "optimizer step, instead of using the engine's recorded behaviour logprobs."
    )
    seed: int = Field(0, description="Seed of the workers' RNGs (rank r uses seed + r).")
    # Timeouts.
    init_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for the workers to start and load the model."
    )
    call_timeout_s: float = Field(
        1800.0, gt=0, description="Longest wait for one broadcast call (an update, a checkpoint)."
    )
    max_restarts: int = Field(
        2, ge=0, description="Times the group is rebuilt when a rank dies: new workers load the "
        "last checkpoint (or the model) and replay the updates made since, then the failed "
        "call runs again, so no update is lost or doubled. 0: a dead rank ends the run."
    )
    max_replay_updates: int = Field(
        64, ge=0, description="Most updates kept (their batches) to replay on a rebuilt group; "
        "beyond them (no checkpoint for that long) a dead rank ends the run, so the kept "
        "batches never grow without bound. Checkpoints reset the count."
    )
    collective_timeout_s: float = Field(
        1800.0, gt=0, description="Timeout of a torch.distributed collective inside the workers."
    )
    weight_transport: TransportName = Field(
        "auto", description="How pushed weights reach the engines (`WeightSync`). " + "; ".join(
            f"'{name}': {transport.summary}" for name, transport in TRANSPORTS.items()) + ".",
    )
    weight_sync_timeout_s: float = Field(
        WEIGHT_SYNC_TIMEOUT_S, gt=0, description="Longest wait for one weight push to reach "
        "every engine (`WeightSync`); past it the push fails with the engines named."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        if self.lr_schedule == "cosine" and self.total_steps is None:
            raise ValueError("lr_schedule='cosine' needs total_steps (the step the decay ends)")
        if self.total_steps is not None and self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be smaller than total_steps "
                f"({self.total_steps})"
            )
        if self.lora is not None and self.trainable_layers is not None:
            raise ValueError(
                "lora and trainable_layers both choose what trains: set one of them "
                f"(got trainable_layers={self.trainable_layers})"
            )
        if self.placement == "in_process":
            ray_only = {
                "world_size > 1": self.world_size != 1,
                "ray_address": self.ray_address is not None,
                "resources": bool(self.resources),
                f"weight_transport {self.weight_transport!r}":
                    TRANSPORTS[self.weight_transport].needs_ray,
            }  # fmt: skip
            if wrong := [name for name, is_set in ray_only.items() if is_set]:
                raise ValueError(
                    f"placement 'in_process' runs one rank in this process without Ray: "
                    f"{', '.join(wrong)} need placement: ray"
                )
        if self.backend == "nccl" and self.num_gpus_per_worker <= 0:
            raise ValueError(
                "backend='nccl' needs GPUs: set num_gpus_per_worker > 0 "
                f"(got {self.num_gpus_per_worker}) or use backend='gloo'"
            )
        return self

    def lr_factor(self, step: int) -> float:
        """Multiplier of `lr` at optimizer step ``step`` (0-based): `warmup_cosine` over
        ``warmup_steps``, then constant, or cosine to ``min_lr_ratio`` at ``total_steps``."""
        total = self.total_steps if self.lr_schedule == "cosine" else None
        return warmup_cosine(step, warmup=self.warmup_steps, total=total, floor=self.min_lr_ratio)


class CriticConfig(ValueLossConfig):
    """The value model of ``advantage_estimator: gae``: a value head on the policy's
    architecture, trained on FSDP2 workers of its own beside the policy's."""

    path: str | None = Field(
        None, description="Local save_pretrained folder the critic starts from (it must share "
        "the policy's tokenizer); None: each trained policy's own model folder."
    )
    lr: float = Field(1e-5, gt=0, description="Peak AdamW learning rate of the critic.")
    warmup_updates: int = Field(
        0, ge=0, description="The first this many updates train the critic only (the policy "
        "is not updated), so its values mean something before they steer the policy "
        "(verl's trainer.critic_warmup)."
    )
    trainer: dict[str, Any] = Field(
        default_factory=dict, description="Trainer options in which the critic differs from "
        "`trainer` (e.g. world_size, num_cpus_per_worker, micro_batch_tokens, "
        "trainable_layers, warmup_steps for its learning rate); the rest are the policy's. "
        "No LoRA: the critic trains every weight of its head and chosen layers."
    )

    @model_validator(mode="after")
    def _trainer_options(self) -> CriticConfig:
        if unknown := set(self.trainer) - set(TrainerConfig.model_fields):
            raise ValueError(f"critic.trainer: unknown trainer options {sorted(unknown)}")
        if self.trainer.get("lora") is not None:
            raise ValueError("critic.trainer.lora: the critic trains without LoRA")
        return self

    @property
    def loss(self) -> ValueLossConfig:
        """The value loss options alone: what the critic workers get."""
        return ValueLossConfig(**self.model_dump(include=set(ValueLossConfig.model_fields)))

    def trainer_config(self, policy: TrainerConfig) -> TrainerConfig:
        """The critic's trainer options: the policy's, with ``lr``, no LoRA and ``trainer``."""
        fields = policy.model_dump(exclude={"lora"}) | {"lr": self.lr} | self.trainer
        return TrainerConfig.model_validate(fields)
