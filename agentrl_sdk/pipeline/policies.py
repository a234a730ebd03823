"""The policies a job serves: per policy an engine behind a `WeightGate`, a trainer if trained.

Policies with ``adapter_of`` are LoRA adapters of the default policy's base: they and the
default policy share its engine and one trainer group, each through a view of its own
(`AdapterView`, `AdapterGroup`), so the pipelines treat them as any other policy.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_sdk.engines import Engine, EnginePool, create_engine
from agentrl_sdk.engines.adapter_view import AdapterView
from agentrl_sdk.engines.gate import WeightGate
from agentrl_sdk.pipeline.config import ModelConfig, TrainConfig
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer import TrainerConfig, TrainerGroup, WeightSync, init_ray
from agentrl_sdk.trainer.adapter_group import AdapterGroup
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.trainer.ray_cluster import ray_if_started

DEFAULT_POLICY = "default"
"""The policy ``model`` configures; ``@trainable`` nodes use it unless they name another."""

logger = logging.getLogger(__name__)


@dataclass
class Policy:
    """One set of weights: the engine that serves it and, if it learns, its trainer."""

    name: str
    path: str
    engine: Engine  # an `AdapterView` of the shared engine for an adapter policy
    gate: WeightGate
    group: TrainerGroup | AdapterGroup | None = None  # None: served, never trained (frozen)
    weight_sync: WeightSync = field(default_factory=WeightSync)
    owns_ray: bool = False  # Ray was started for this job's engine actors: shut it down after

    def prefix(self, section: str) -> str:
        """Metric prefix: ``train/`` for the default policy, ``train/<name>/`` for others."""
        return metric_prefix(section, self.name)

    def engine_metrics(self) -> dict[str, float]:
        """The engine pool's failure counts (``engine/reroutes``, ...); none for one engine."""
        engine = self.engine
        if isinstance(engine, AdapterView):
            if self.name != DEFAULT_POLICY:
                return {}  # a shared pool's counts are reported once, by the default policy
            engine = engine.engine
        if not isinstance(engine, EnginePool):
            return {}
        return {f"{self.prefix('engine')}{k}": v for k, v in engine.stats().items()}

    def checkpoint_dir(self, root: str | Path) -> Path:
        """Where this policy's checkpoints live under the job's checkpoint root."""
        root = Path(root)
        return root if self.name == DEFAULT_POLICY else root / "policies" / self.name


def metric_prefix(section: str, policy: str) -> str:
    """A policy's metric prefix in ``section``: ``<section>/``, or ``<section>/<policy>/``."""
    return f"{section}/" if policy == DEFAULT_POLICY else f"{section}/{policy}/"


def critic_checkpoint_dir(policy: Policy, root: str | Path) -> Path:
    """Where a policy's critic checkpoints live: ``critic/`` beside its own ``step_*`` ones."""
    return policy.checkpoint_dir(root) / "critic"


def model_path(model: ModelConfig, name: str = DEFAULT_POLICY) -> str:
    """The local folder of a policy's weights (resolved from ``builder`` beforehand)."""
    if not model.path or not Path(model.path).is_dir():
        where = "model.path" if name == DEFAULT_POLICY else f"policies.{name}.path"
        raise ValueError(
            f"{where} must be a local save_pretrained folder, got {model.path!r} "
            "(build one with `agentrl build-model OUT` or agentrl_sdk.models)"
        )
    return model.path


_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def engine_kwargs(config: TrainConfig) -> dict[str, Any]:
    """`create_engine` arguments: the engine section's, plus what adapter pushes need of an
    in-process vLLM engine (``enable_lora``, a ``max_lora_rank`` that fits ``trainer.lora``)
    unless ``engine_args`` sets them."""
    kwargs = config.engine.create_kwargs()
    if (threads := cpu_threads_beside_trainers(config)) is not None:
        kwargs.setdefault("cpu_threads", threads)
    lora = config.trainer.lora
    adapters = lora is not None and (lora.sync == "adapter" or bool(config.adapter_policies))
    if config.engine.backend == "vllm" and lora is not None and adapters:
        args = dict(kwargs.get("engine_args") or {})
        args.setdefault("enable_lora", True)
        fits = [r for r in _VLLM_LORA_RANKS if r >= lora.rank]
        args.setdefault("max_lora_rank", fits[0] if fits else lora.rank)
        kwargs["engine_args"] = args
    return kwargs


def cpu_threads_beside_trainers(config: TrainConfig) -> int | None:
    """The engines' CPU threads when they compute at the same time as trainers on the same
    cores (``fully_async``, CPU trainers of this job's local Ray): the usable cores the
    trainer workers do not reserve, at least one. None otherwise (the engine's default).

    Both sides' OpenMP threads spin while they wait for work: oversubscribed, each slows
    the other many times over (the demo's async updates were slower than sync ones).
    """
    if config.pipeline != "fully_async" or not _local_cpu_trainers(config) or config.engine.url:
        return None
    workers = config.trained_policy_groups * config.trainer.world_size  # training at once
    reserved = math.ceil(workers * config.trainer.num_cpus_per_worker)
    return max(1, len(os.sched_getaffinity(0)) - reserved)


def trainer_options(config: TrainConfig) -> TrainerConfig:
    """``config.trainer`` with what is derived from the rest: its ``temperature`` is the
    rollouts' (the trainer's logprobs are those of the distribution the engine sampled from),
    and its CPU workers in the ``sync`` pipeline of a local Ray train on every usable core,
    split between the workers training at once (unless ``cpu_threads`` is set): the engines
    are idle while they train, and a worker with the one thread of its ``num_cpus_per_worker``
    left the other cores idle (the demo's updates: 1.34 vs 1.09 s)."""
    trainer = config.trainer
    sampled = config.rollout.sampling.temperature
    if sampled > 0:  # greedy rollouts train nothing new: keep the configured scale
        trainer = trainer.model_copy(update={"temperature": sampled})
    if config.pipeline != "sync" or trainer.cpu_threads or not _local_cpu_trainers(config):
        return trainer
    share = len(os.sched_getaffinity(0)) // (config.trained_policy_groups * trainer.world_size)
    threads = max(1, int(trainer.num_cpus_per_worker), share)
    return trainer.model_copy(update={"cpu_threads": threads})


def _local_cpu_trainers(config: TrainConfig) -> bool:
    """Whether the trainers are CPU workers of a Ray on this machine (they share its cores)."""
    return config.trainer.num_gpus_per_worker == 0 and config.trainer.ray_address is None


async def start_policies(config: TrainConfig, *, trainers: bool = True) -> dict[str, Policy]:
    """Engines for every policy, then trainers for the trained ones (none without
    ``trainers``: an evaluation only serves); all torn down on failure."""
    adapters = config.adapter_policies
    specs = {DEFAULT_POLICY: (config.model, True)}
    specs |= {name: (spec, spec.trained) for name, spec in config.policies.items()}
    policies: dict[str, Policy] = {}
    owns_ray = config.engine.ray_actors and await run_blocking(init_ray, config.trainer)
    try:
        for name, (spec, _) in specs.items():
            if name in adapters:
                continue  # served by the default policy's engine
            path = model_path(spec, name)
            engine = create_engine(config.engine.backend, path, **engine_kwargs(config))
            # The engine starts from the trainer's model folder: only trained tensors travel.
            sync = WeightSync(timeout_s=config.trainer.weight_sync_timeout_s,
                              transport=config.trainer.weight_transport, changed_only=True)
            policies[name] = Policy(
                name, path, engine, WeightGate(engine), weight_sync=sync, owns_ray=owns_ray
            )
        shared = {DEFAULT_POLICY, *adapters} if adapters else set()
        if adapters:
            policies |= await _adapter_policies(config, policies[DEFAULT_POLICY], trainers)
        for name, (_, trained) in specs.items():
            if trained and trainers and name not in shared:
                policy = policies[name]
                policy.group = await run_blocking(
                    TrainerGroup, policy.path, trainer_options(config), config.algorithm.loss
                )
    except BaseException:
        await stop_policies(policies)
        if owns_ray and not policies:
            await run_blocking(_shutdown_ray)
        raise
    return policies


async def _adapter_policies(
    config: TrainConfig, base: Policy, trainers: bool
) -> dict[str, Policy]:
    """The default policy and the ``adapter_of`` policies as adapters of ``base``'s model:
    one engine (``base.engine``) and one trainer group with an adapter per trained policy.

    A trained adapter's engine view serves its named adapter, pushed once here so that the
    engine holds it before the first request; a frozen one (or any, without ``trainers``)
    serves the bare base: an adapter that never trains is PEFT's identity.
    """
    trained = [DEFAULT_POLICY] + [
        name for name in config.adapter_policies if config.policies[name].trained
    ]
    served = [DEFAULT_POLICY, *config.adapter_policies]
    group = None
    if trainers:
        group = await run_blocking(
            TrainerGroup, base.path, trainer_options(config), config.algorithm.loss,
            adapters=trained,
        )
    policies: dict[str, Policy] = {}
    try:
        for name in served:
            adapter = name if group is not None and name in trained else None
            view = AdapterView(base.engine, adapter)
            policy = Policy(name, base.path, view, WeightGate(view), owns_ray=base.owns_ray)
            if adapter is not None:
                policy.group = AdapterGroup(group, adapter)
                await policy.weight_sync.push(policy.group.weights, [policy.engine], version=0)
            policies[name] = policy
    except BaseException:
        if group is not None:
            await run_blocking(group.shutdown)
        raise
    return policies


async def stop_policies(policies: dict[str, Policy]) -> None:
    """Close every engine and shut every trainer down (the one that started Ray last)."""
    for policy in policies.values():
        try:
            policy.engine.close()
        except Exception as exc:  # noqa: BLE001 - the other policies still get stopped
            logger.warning("closing the engine of policy %r failed: %r", policy.name, exc)
    for policy in reversed(list(policies.values())):
        if policy.group is not None:
            await run_blocking(policy.group.shutdown)
    if any(p.owns_ray for p in policies.values()):
        await run_blocking(_shutdown_ray)


def _shutdown_ray() -> None:
    if ray := ray_if_started():
        ray.shutdown()


async def start_critics(
    config: TrainConfig, policies: Sequence[Policy]
) -> dict[str, CriticGroup]:
    """A `CriticGroup` per trained policy when the job uses GAE (else none); all shut down if
    one fails to start."""
    if not config.algorithm.estimator.needs_values:  # no value models to train
        return {}
    critic = config.critic
    trainer, loss = critic.trainer_config(trainer_options(config)), critic.loss
    critics: dict[str, CriticGroup] = {}
    try:
        for policy in policies:
            if policy.group is not None:
                critics[policy.name] = await run_blocking(
                    CriticGroup, critic.path or policy.path, trainer, loss
                )
    except BaseException:
        await stop_critics(critics)
        raise
    return critics


async def stop_critics(critics: dict[str, CriticGroup]) -> None:
    """Shut every critic down (before the policies' trainers: the first of those owns Ray)."""
    for group in critics.values():
        await run_blocking(group.shutdown)
