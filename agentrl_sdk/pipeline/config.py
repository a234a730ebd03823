"""`TrainConfig`: everything ``sdk.train`` needs, one pydantic model that round-trips YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from agentrl_sdk.algorithms.config import (
    AlgorithmConfig,
    DynamicSamplingConfig,
    OverlongConfig,
    StepLevelConfig,
)
from agentrl_sdk.config import ConfigSection, RolloutConfig, TreeConfig
from agentrl_sdk.engines.config import EngineConfig
from agentrl_sdk.rollout.rewards import OnRewardError
from agentrl_sdk.tracing.config import TrackingConfig
from agentrl_sdk.tracing.traces import TraceSampling
from agentrl_sdk.trainer.config import CriticConfig, TrainerConfig
from agentrl_sdk.types import SamplingParams

# Sections kept beside the component each configures, importable from here as before.
__all__ = [
    "AlgorithmConfig", "AsyncConfig", "CheckpointConfig", "CriticConfig", "DataConfig",
    "DynamicSamplingConfig", "EngineConfig", "EntrypointConfig", "EvalConfig", "ModelConfig",
    "OverlongConfig", "PolicyConfig", "RewardConfig", "StepLevelConfig", "TrackingConfig",
    "TrainConfig",
]


class ModelConfig(ConfigSection):
    """The policy's starting weights."""

    path: str | None = Field(
        None, description="Local save_pretrained folder (weights + tokenizer); no hub ids."
    )
    builder: str | None = Field(
        None, description="'module:function' returning a local model folder; used by "
        "`agentrl train` when path is unset (e.g. a project-built tiny model)."
    )


class PolicyConfig(ModelConfig):
    """Another policy of the job (a separate set of weights that some nodes name)."""

    trained: bool = Field(
        True, description="Train this policy; False serves it frozen (its weights never change)."
    )
    adapter_of: Literal["default"] | None = Field(
        None, description="Make this policy a LoRA adapter (trainer.lora) of the default "
        "policy's base model instead of a model of its own: one engine serves the base and "
        "every adapter (per request), one trainer holds the base once and one adapter and "
        "optimizer per trained adapter policy; the default policy is then an adapter too. A "
        "frozen adapter (trained: false) is a fresh adapter, i.e. it serves the bare base."
    )

    @model_validator(mode="after")
    def _adapter_has_no_weights(self) -> PolicyConfig:
        if self.adapter_of is not None and (self.path or self.builder):
            raise ValueError(
                f"a policy with adapter_of: {self.adapter_of} shares that policy's base model: "
                "set no path or builder"
            )
        return self


class EntrypointConfig(ConfigSection):
    """What `agentrl train config.yaml` imports; ``sdk.train`` takes these as arguments."""

    graph: str | None = Field(
        None, description="'module:attr': a compiled graph, or a function that returns one."
    )
    dataset: str | None = Field(
        None, description="A .jsonl/.parquet path, or 'module:function' returning rows."
    )
    reward: str | None = Field(None, description="'module:function' reward(state, row, trajectory).")
    input_fn: str | None = Field(None, description="'module:function' row -> graph input.")
    eval_dataset: str | None = Field(
        None, description="Held-out rows for `evaluation` (and `agentrl evaluate`): a "
        ".jsonl/.parquet path, or 'module:function' returning rows."
    )


class DataConfig(ConfigSection):
    """How dataset rows become training steps."""

    batch_size: int = Field(8, ge=1, description="Dataset rows per step (each sampled rollout.n times).")
    shuffle: bool = Field(True, description="Reshuffle rows every epoch (seeded).")
    seed: int = Field(0, description="Seed of the row order.")
    on_bad_row: Literal["skip", "raise"] = Field(
        "skip", description="A row that fails validation is logged, counted and left out "
        "(skip), or stops the job before it starts (raise)."
    )


class RewardConfig(ConfigSection):
    """How rewards that cannot be computed are treated."""

    on_error: OnRewardError = Field(
        "zero", description="A reward function that raises or returns None/NaN: score 0 or drop."
    )
    failed_rollout_reward: float = Field(
        0.0, description="Reward of a rollout that ended with a status other than ok."
    )


class CheckpointConfig(ConfigSection):
    """Where and how often to checkpoint."""

    dir: str | None = Field(None, description="Checkpoint folder; None disables checkpoints.")
    every: int = Field(0, ge=0, description="Checkpoint every this many steps (0: at the end only).")
    resume: bool = Field(False, description="Continue from the newest checkpoint in dir.")
    keep_last: int | None = Field(
        None, ge=1, description="Keep only the newest this many step_* checkpoints in dir, "
        "deleting older ones as new ones are written (None: keep all; copies logged as MLflow "
        "artifacts stay)."
    )
    export_final: bool = Field(True, description="Write the final policy as a save_pretrained folder.")


class EvalConfig(ConfigSection):
    """Evaluation on held-out rows: during training (``every``) and by ``sdk.evaluate``."""

    every: int = Field(
        0, ge=0, description="Evaluate the served weights every this many updates during "
        "training (0: never; needs an eval dataset)."
    )
    before_train: bool = Field(
        True, description="With `every` set, also evaluate the starting weights (update 0)."
    )
    n: int = Field(1, ge=1, description="Samples per held-out row (pass@k for k up to n).")
    sampling: SamplingParams | None = Field(
        None, description="How evaluation samples; None: the rollout's sampling made greedy "
        "(temperature 0), so repeated evaluations of the same weights agree."
    )
    pass_threshold: float = Field(
        1.0, description="A sample passes when its reward is at least this (pass@k)."
    )
    max_rows: int | None = Field(
        None, ge=1, description="Evaluate only the first this many held-out rows."
    )
    traces: TraceSampling = Field(
        "failures", description="Evaluation rollouts traced (tag phase=eval): all, first_k "
        "(tracking.traces_k rows), failures or off."
    )

    @model_validator(mode="after")
    def _samples_can_differ(self) -> EvalConfig:
        if self.n > 1 and (self.sampling is None or self.sampling.temperature == 0):
            raise ValueError(
                f"evaluation.n ({self.n}) needs evaluation.sampling with temperature > 0: "
                "greedy samples of one row are all the same"
            )
        return self

    def rollout(self, rollout: RolloutConfig) -> RolloutConfig:
        """The training rollout settings with this evaluation's samples and sampling; its
        samples run from the start each (no trees: independent samples measure the policy)."""
        sampling = self.sampling or rollout.sampling.model_copy(
            update={"temperature": 0.0, "seed": None}
        )
        return rollout.model_copy(update={"n": self.n, "sampling": sampling, "tree": TreeConfig()})

    def due(self, updates: int) -> bool:
        """Whether the weights after ``updates`` policy updates are evaluated in training."""
        return bool(self.every) and (updates % self.every == 0 if updates else self.before_train)


class AsyncConfig(ConfigSection):
    """The fully-asynchronous pipeline: rollouts and updates at once, staleness bounded."""

    max_staleness: int = Field(
        1, ge=0, description="Policy versions (trainer updates) a trained token may lag the "
        "weights being updated; 0 is on-policy and reproduces the sync pipeline exactly. New "
        "rows are admitted only while what is in flight and queued stays within it."
    )
    sync_every: int = Field(
        1, ge=1, description="Push the trainer's weights to the engines every this many "
        "updates (engines are paused, in-flight requests keep their tokens and continue)."
    )
    on_stale: Literal["drop", "retry"] = Field(
        "drop", description="A finished group older than max_staleness when the trainer takes "
        "it (a long-tail rollout): dropped and counted, or its row rolled out again (counted)."
    )

    @property
    def weight_lag(self) -> int:
        """Updates the engines' weights may trail the trainer's between pushes."""
        return self.sync_every - 1


class TrainConfig(ConfigSection):
    """A training job: model, engine, rollouts, algorithm, trainer, data, tracking."""

    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The default policy's starting weights."
    )
    policies: dict[str, PolicyConfig] = Field(
        default_factory=dict, description="Policies besides 'default' (= model), by the name "
        "nodes give in @trainable(policy=...) / @frozen(policy=...); each gets its own engine "
        "and, when trained, its own trainer. They share the default policy's tokenizer."
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The inference engine rollouts sample from "
        "(each policy gets one built from it)."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="How rollouts of the graph are collected: "
        "samples per row, sampling, the chat model's budget, node attribution, trees."
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="The policy loss, the advantage estimator "
        "and how rewards become its batch."
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig, description="The policy trainer: placement, sharding, "
        "optimizer, schedule and batching."
    )
    critic: CriticConfig = Field(
        default_factory=CriticConfig, description="The value model; used only with "
        "algorithm.advantage_estimator: gae (PPO with a critic)."
    )
    data: DataConfig = Field(
        default_factory=DataConfig, description="How dataset rows become training steps."
    )
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="How rewards that cannot be computed are "
        "treated."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Where and how often to checkpoint, and "
        "whether to resume."
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="MLflow tracking: the run, its metrics and "
        "the rollout traces."
    )
    entrypoint: EntrypointConfig = Field(
        default_factory=EntrypointConfig, description="What `agentrl train` and `agentrl "
        "evaluate` import: graph, dataset, reward; `sdk.train` takes them as arguments instead."
    )
    max_steps: int = Field(10, ge=1, description="Policy updates to run.")
    epochs: int | None = Field(
        None, ge=1, description="Passes over the dataset; when set, max_steps becomes epochs x "
        "the full batches of data.batch_size rows in one pass."
    )
    pipeline: Literal["sync", "fully_async"] = Field(
        "sync", description="sync: roll out a batch, then update; fully_async: rollouts "
        "stream into a bounded queue while the trainer updates (see fully_async)."
    )
    fully_async: AsyncConfig = Field(
        default_factory=AsyncConfig, description="Staleness bound and weight pushes of "
        "pipeline: fully_async (ignored by the sync pipeline)."
    )
    evaluation: EvalConfig = Field(
        default_factory=EvalConfig, description="Evaluation on held-out rows, during training "
        "and by `sdk.evaluate` / `agentrl evaluate`."
    )
    prefetch_rollouts: bool = Field(
        True, description="Start the next step's rollouts while the trainer updates: graph "
        "start-up and prompt rendering overlap the update, and the first LLM call of each "
        "waits for the new weights, so training stays on-policy."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if "default" in self.policies:
            raise ValueError("policies must not redefine 'default': that policy is `model`")
        for pattern, rule in self.rollout.nodes.items():
            if rule.policy != "default" and rule.policy not in self.policies:
                raise ValueError(
                    f"rollout.nodes[{pattern!r}] names policy {rule.policy!r}, which is not "
                    f"'default' nor one of policies: {sorted(self.policies)}"
                )
        staleness = self.fully_async
        if self.pipeline == "fully_async" and staleness.max_staleness < staleness.weight_lag:
            raise ValueError(
                f"fully_async.max_staleness ({staleness.max_staleness}) must be at least "
                f"fully_async.sync_every - 1 ({staleness.weight_lag}): between pushes the "
                "engines sample with weights that many updates old"
            )
        if self.algorithm.dynamic_sampling.enabled and self.rollout.n < 2:
            raise ValueError(f"algorithm.dynamic_sampling needs rollout.n >= 2 (got "
                             f"{self.rollout.n}): a group of one rollout never has signal")
        max_tokens = self.rollout.sampling.max_tokens
        if self.algorithm.overlong.buffer >= max_tokens:
            raise ValueError(f"algorithm.overlong.buffer ({self.algorithm.overlong.buffer}) must "
                             f"be below rollout.sampling.max_tokens ({max_tokens})")
        if self.checkpoint.resume and not self.checkpoint.dir:
            raise ValueError("checkpoint.resume needs checkpoint.dir")
        sampled = self.rollout.sampling.temperature
        explicit = "temperature" in self.trainer.model_fields_set
        if explicit and sampled > 0 and abs(self.trainer.temperature - sampled) > 1e-9:
            raise ValueError(
                f"trainer.temperature ({self.trainer.temperature}) must equal "
                f"rollout.sampling.temperature ({sampled}): the trainer's logprobs must be those "
                "of the distribution the engine sampled from"
            )
        if self.adapter_policies and self.trainer.lora is None:
            raise ValueError(
                f"policies {sorted(self.adapter_policies)} set adapter_of, which needs "
                "trainer.lora (the adapters' rank, alpha and target modules)"
            )
        policies = self.trained_policy_groups
        in_process = policies * (self.trainer.placement == "in_process")
        if self.algorithm.estimator.needs_values:
            critic = self.critic.trainer_config(self.trainer)
            in_process += policies * (critic.placement == "in_process")
        if in_process > 1:
            raise ValueError(
                f"trainer.placement 'in_process' would put {in_process} trainers (policies and "
                "critics) in this process, which holds one: set placement: ray, or "
                "critic.trainer: {placement: ray} for the critic"
            )
        return self

    @property
    def trained_policy_groups(self) -> int:
        """Trainer groups of the policies this job trains: the default policy's, and one per
        other trained policy that is not an adapter (adapters train in the default's group)."""
        return 1 + sum(spec.trained and not spec.adapter_of for spec in self.policies.values())

    @property
    def adapter_policies(self) -> list[str]:
        """The policies that are LoRA adapters of the default policy's base (``adapter_of``)."""
        return [name for name, p in self.policies.items() if p.adapter_of is not None]

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Load a YAML file; errors name the file and the offending field."""
        try:
            return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_yaml(self, path: str | Path) -> None:
        """Write the full config (defaults included) as YAML."""
        Path(path).write_text(yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False))
