"""`TrainConfig`: everything ``sdk.train`` needs, one pydantic model that round-trips YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl_sdk.algorithms import AdvantageEstimator, Estimator, PolicyLossConfig, ValueLossConfig
from agentrl_sdk.algorithms.estimators import GAEEstimator, make_estimator
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.engines.options import (
    BACKEND_OPTIONS,
    EngineOptions,
    TorchOptions,
    VLLMOptions,
    VLLMServerOptions,
)
from agentrl_sdk.rollout.rewards import OnRewardError
from agentrl_sdk.tracing import TraceSampling
from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.types import SamplingParams


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
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


class EntrypointConfig(_Section):
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


class EngineConfig(_Section):
    """The inference engine rollouts sample from."""

    backend: Literal["torch", "vllm", "vllm-server"] = Field(
        "torch", description="Engine implementation: embedded torch, in-process vLLM, or a "
        "vLLM OpenAI-compatible server (started here, or at `url`)."
    )
    max_batch_size: int = Field(64, ge=1, description="Requests decoded together.")
    replicas: int = Field(1, ge=1, description="Engine replicas behind one EnginePool.")
    ray_actors: bool = Field(
        False, description="Run each engine replica in its own Ray actor (its own process and "
        "resources, apart from the driver and the trainer workers)."
    )
    max_restarts: int = Field(
        3, ge=0, description="Engine replicas rebuilt when one dies (a killed Ray actor, a "
        "failed health check): its requests move to the others (or fail, counted, if it was "
        "the only one) and the new replica serves from the next weight push."
    )
    url: str | None = Field(None, description="vllm-server: a running server to use.")
    options: TorchOptions | VLLMOptions | VLLMServerOptions = Field(
        default_factory=TorchOptions,
        description="The backend's own options, checked against its options model "
        "(`agentrl_sdk.engines.options`): torch: dtype; vllm: dtype, max_model_len, "
        "engine_args, cpu_threads, timeouts; vllm-server: the same with server_args. On CPUs "
        "vLLM gets every usable CPU as torch threads unless cpu_threads or OMP_NUM_THREADS "
        "says otherwise.",
    )

    @model_validator(mode="before")
    @classmethod
    def _options_of_the_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("options"), EngineOptions):
            backend = data.get("backend", "torch")
            if backend in BACKEND_OPTIONS:  # else the backend field reports the error
                model = BACKEND_OPTIONS[backend]
                try:
                    options = model.model_validate(data.get("options") or {})
                except ValidationError as exc:
                    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                         for e in exc.errors())
                    raise ValueError(f"engine.options of backend {backend!r}: {problems} "
                                     f"(allowed: {sorted(model.model_fields)})") from None
                data = {**data, "options": options}
        return data

    @model_validator(mode="after")
    def _url_for_server(self) -> EngineConfig:
        if self.url is not None and self.backend != "vllm-server":
            raise ValueError(f"engine.url is for backend 'vllm-server', not {self.backend!r}")
        if not isinstance(self.options, BACKEND_OPTIONS[self.backend]):
            raise ValueError(f"engine.options are {type(self.options).__name__}, not the "
                             f"{BACKEND_OPTIONS[self.backend].__name__} of {self.backend!r}")
        if self.options.actor_options is not None and not self.ray_actors:
            raise ValueError("engine.options.actor_options needs engine.ray_actors: true")
        return self

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `create_engine` besides the backend and model path."""
        kwargs: dict[str, Any] = {
            "max_batch_size": self.max_batch_size, **self.options.engine_kwargs()
        }
        if self.url is not None:
            kwargs["url"] = self.url
        return {"replicas": self.replicas, "ray_actors": self.ray_actors,
                "max_restarts": self.max_restarts, **kwargs}


class DataConfig(_Section):
    """How dataset rows become training steps."""

    batch_size: int = Field(8, ge=1, description="Dataset rows per step (each sampled rollout.n times).")
    shuffle: bool = Field(True, description="Reshuffle rows every epoch (seeded).")
    seed: int = Field(0, description="Seed of the row order.")
    on_bad_row: Literal["skip", "raise"] = Field(
        "skip", description="A row that fails validation is logged, counted and left out "
        "(skip), or stops the job before it starts (raise)."
    )


class RewardConfig(_Section):
    """How rewards that cannot be computed are treated."""

    on_error: OnRewardError = Field(
        "zero", description="A reward function that raises or returns None/NaN: score 0 or drop."
    )
    failed_rollout_reward: float = Field(
        0.0, description="Reward of a rollout that ended with a status other than ok."
    )


class DynamicSamplingConfig(_Section):
    """DAPO's dynamic sampling: train only on groups whose rewards differ."""

    enabled: bool = Field(
        False, description="Drop (row, policy) groups whose rewards all agree (their advantages "
        "are all zero), counted as groups_dropped_no_signal, and sample more rows until "
        "data.batch_size rows with signal are in the batch. Signal is judged on each policy's "
        "rollout rewards (with step_level too)."
    )
    max_extra_rounds: int = Field(
        4, ge=0, description="sync: extra batches of rows rolled out per step at most; then "
        "the step trains on what it has. fully_async: the trainer drops at most this many "
        "batches of groups per step, then trains on the groups with signal it has. 0: groups "
        "without signal are left out, and no more rows are sampled."
    )


class OverlongConfig(_Section):
    """DAPO's over-long handling of responses that reach their token budget."""

    drop_truncated: bool = Field(
        False, description="Leave out of training rollouts whose last LLM call ended with "
        "finish_reason length (counted as rollouts_dropped_truncated)."
    )
    buffer: int = Field(
        0, ge=0, description="Soft penalty: a response within the last `buffer` tokens before "
        "rollout.sampling.max_tokens loses up to `penalty` linearly (reward component "
        "'overlong', crediting the call's node and step); 0 is off."
    )
    penalty: float = Field(1.0, ge=0.0, description="The soft penalty at max_tokens.")


class StepLevelConfig(_Section):
    """Step-level credit: each LLM call its own sample and advantage."""

    enabled: bool = Field(
        False, description="Advantages per LLM call from discounted returns over the policy's "
        "calls in the rollout (rewards emitted with step= credit one call; the rest of the "
        "policy's reward comes at its last call), baselined per (row, policy) group as "
        "advantage_estimator says. Each call is trained as its own sequence."
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per LLM call.")
    anchor_weight: float | None = Field(
        None, ge=0.0, description="GiGPO: a call's advantage is its rollout's group advantage "
        "plus this weight times its return's advantage among the calls (of the same row and "
        "policy) that start from the same anchor state: the same node seeing the same new "
        "tokens (tool results), or the same whole prompt. None: returns against the group."
    )

    @model_validator(mode="after")
    def _anchors_are_step_level(self) -> StepLevelConfig:
        if self.anchor_weight is not None and not self.enabled:
            raise ValueError("algorithm.step_level.anchor_weight needs "
                             "algorithm.step_level.enabled: true")
        return self


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
        unknown = set(self.trainer) - set(TrainerConfig.model_fields)
        if unknown:
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


class AlgorithmConfig(PolicyLossConfig):
    """The policy loss (`PolicyLossConfig`) and how rewards become its batch: the weight of
    the shared outcome, dynamic sampling, over-long handling and step-level credit."""

    outcome_reward_weight: float = Field(
        1.0, description="Weight of the shared outcome (the reward function's value and rewards "
        "crediting no node) in each policy's reward; components crediting a policy's nodes "
        "count in full. 0: each policy learns from its own credit only."
    )
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    step_level: StepLevelConfig = Field(default_factory=StepLevelConfig)
    gae: GAEEstimator = Field(default_factory=GAEEstimator)

    @model_validator(mode="after")
    def _step_baseline(self) -> AlgorithmConfig:
        baselines = get_args(AdvantageEstimator)
        if self.step_level.enabled and self.advantage_estimator not in baselines:
            raise ValueError(f"algorithm.step_level needs algorithm.advantage_estimator in "
                             f"{baselines}, not {self.advantage_estimator!r}")
        return self

    @property
    def estimator(self) -> Estimator:
        """The advantage estimator: step-level credit over the ``advantage_estimator`` baseline
        when ``step_level`` is enabled, else ``advantage_estimator`` with the ``gae`` options."""
        step = self.step_level
        if step.enabled:
            return make_estimator("step", baseline=self.advantage_estimator, gamma=step.gamma,
                                  omega=step.anchor_weight)  # fmt: skip
        return make_estimator(self.advantage_estimator, **self.gae.model_dump())

    @property
    def loss(self) -> PolicyLossConfig:
        """The loss options alone: what the trainer workers get (they import no pipeline)."""
        return PolicyLossConfig(**self.model_dump(include=set(PolicyLossConfig.model_fields)))


class CheckpointConfig(_Section):
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


class TrackingConfig(_Section):
    """MLflow tracking: one run per job, one trace per sampled rollout."""

    enabled: bool = True
    uri: str = Field(
        "sqlite:///mlflow.db", description="MLflow tracking URI (sqlite file or `mlflow server`)."
    )
    experiment: str = Field("agentrl", description="MLflow experiment name.")
    run_name: str | None = None
    traces: TraceSampling = Field(
        "first_k", description="Rollouts traced per step: all, those of the first traces_k rows, "
        "failures (status not ok) only, or off."
    )
    traces_k: int = Field(1, ge=1, description="Rows whose rollouts are traced per step (first_k).")
    log_checkpoints: bool = Field(
        True, description="Log every checkpoint folder as run artifacts (the final model always)."
    )
    timeout_s: float = Field(
        10.0, gt=0, description="Seconds one request to the tracking store may take. Opening "
        "the run (before any engine starts) makes one attempt and fails with the URI in the "
        "error; later writes are buffered, retried in the background and counted "
        "(tracking/failed_writes), never stopping training."
    )
    end_timeout_s: float = Field(
        120.0, ge=0, description="How long the end of a job waits for buffered writes and "
        "traces to reach the store (after the engines and trainers stopped); what is left is "
        "dropped and counted (tracking/dropped_writes)."
    )


class EvalConfig(_Section):
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
        """The training rollout settings with this evaluation's samples and sampling."""
        sampling = self.sampling or rollout.sampling.model_copy(
            update={"temperature": 0.0, "seed": None}
        )
        return rollout.model_copy(update={"n": self.n, "sampling": sampling})

    def due(self, updates: int) -> bool:
        """Whether the weights after ``updates`` policy updates are evaluated in training."""
        if not self.every:
            return False
        return updates % self.every == 0 if updates else self.before_train


class AsyncConfig(_Section):
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


class TrainConfig(_Section):
    """A training job: model, engine, rollouts, algorithm, trainer, data, tracking."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    policies: dict[str, PolicyConfig] = Field(
        default_factory=dict, description="Policies besides 'default' (= model), by the name "
        "nodes give in @trainable(policy=...) / @frozen(policy=...); each gets its own engine "
        "and, when trained, its own trainer. They share the default policy's tokenizer."
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    critic: CriticConfig = Field(
        default_factory=CriticConfig, description="The value model; used only with "
        "algorithm.advantage_estimator: gae (PPO with a critic)."
    )
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    entrypoint: EntrypointConfig = Field(default_factory=EntrypointConfig)
    max_steps: int = Field(10, ge=1, description="Policy updates to run.")
    epochs: int | None = Field(
        None, ge=1, description="Passes over the dataset; when set, max_steps becomes epochs x "
        "the full batches of data.batch_size rows in one pass."
    )
    pipeline: Literal["sync", "fully_async"] = Field(
        "sync", description="sync: roll out a batch, then update; fully_async: rollouts "
        "stream into a bounded queue while the trainer updates (see fully_async)."
    )
    fully_async: AsyncConfig = Field(default_factory=AsyncConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
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
        if sampled > 0 and abs(self.trainer.temperature - sampled) > 1e-9:
            raise ValueError(
                f"trainer.temperature ({self.trainer.temperature}) must equal "
                f"rollout.sampling.temperature ({sampled}): the trainer's logprobs must be those "
                "of the distribution the engine sampled from"
            )
        return self

    @model_validator(mode="after")
    def _adapters_need_lora(self) -> TrainConfig:
        adapters = sorted(name for name, p in self.policies.items() if p.adapter_of)
        if adapters and self.trainer.lora is None:
            raise ValueError(
                f"policies {adapters} set adapter_of, which needs trainer.lora (the adapters' "
                "rank, alpha and target modules)"
            )
        return self

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
