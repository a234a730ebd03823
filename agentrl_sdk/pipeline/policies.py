"""The policies a job serves: per policy an engine behind a `WeightGate`, and a trainer if trained."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_sdk.engines import Engine, EnginePool, create_engine
from agentrl_sdk.pipeline.config import ModelConfig, TrainConfig
from agentrl_sdk.pipeline.gate import WeightGate
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer import TrainerGroup, WeightSync, init_ray

DEFAULT_POLICY = "default"
"""The policy ``model`` configures; ``@trainable`` nodes use it unless they name another."""

logger = logging.getLogger(__name__)


@dataclass
class Policy:
    """One set of weights: the engine that serves it and, if it learns, its trainer."""

    name: str
    path: str
    engine: Engine
    gate: WeightGate
    group: TrainerGroup | None = None  # None: served but never trained (a frozen policy)
    weight_sync: WeightSync = field(default_factory=WeightSync)
    owns_ray: bool = False  # Ray was started for this job's engine actors: shut it down after

    def prefix(self, section: str) -> str:
        """Metric prefix: ``train/`` for the default policy, ``train/<name>/`` for others."""
        return f"{section}/" if self.name == DEFAULT_POLICY else f"{section}/{self.name}/"

    def engine_metrics(self) -> dict[str, float]:
        """The engine pool's failure counts (``engine/reroutes``, ...); none for one engine."""
        if not isinstance(self.engine, EnginePool):
            return {}
        return {f"{self.prefix('engine')}{k}": v for k, v in self.engine.stats().items()}

    def checkpoint_dir(self, root: str | Path) -> Path:
        """Where this policy's checkpoints live under the job's checkpoint root."""
        root = Path(root)
        return root if self.name == DEFAULT_POLICY else root / "policies" / self.name


def model_path(model: ModelConfig, name: str = DEFAULT_POLICY) -> str:
    """The local folder of a policy's weights (resolved from ``builder`` beforehand)."""
    if not model.path or not Path(model.path).is_dir():
        where = "model.path" if name == DEFAULT_POLICY else f"policies.{name}.path"
        raise ValueError(
            f"{where} must be a local save_pretrained folder, got {model.path!r} "
            "(build one with `agentrl build-model OUT` or agentrl_sdk.models)"
        )
    return model.path


async def start_policies(config: TrainConfig, *, trainers: bool = True) -> dict[str, Policy]:
    """Engines for every policy, then trainers for the trained ones (none without
    ``trainers``: an evaluation only serves); all torn down on failure."""
    specs = {DEFAULT_POLICY: (config.model, True)}
    specs |= {name: (spec, spec.trained) for name, spec in config.policies.items()}
    policies: dict[str, Policy] = {}
    owns_ray = config.engine.ray_actors and await run_blocking(init_ray, config.trainer)
    try:
        for name, (spec, _) in specs.items():
            path = model_path(spec, name)
            engine = create_engine(config.engine.backend, path, **config.engine.create_kwargs())
            policies[name] = Policy(name, path, engine, WeightGate(engine), owns_ray=owns_ray)
        for name, (_, trained) in specs.items():
            if trained and trainers:
                policy = policies[name]
                policy.group = await run_blocking(
                    TrainerGroup, policy.path, config.trainer, config.algorithm.loss
                )
    except BaseException:
        await stop_policies(policies)
        if owns_ray and not policies:
            await run_blocking(_shutdown_ray)
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
    import ray

    if ray.is_initialized():
        ray.shutdown()
