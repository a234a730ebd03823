"""PPO with a critic in the pipelines: a value model per trained policy, token advantages (GAE)
from its values before an update, and its own update after the policy's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl_sdk.algorithms import Estimator, Sequences
from agentrl_sdk.algorithms.estimators import padded
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.policies import DEFAULT_POLICY, Policy, trainer_options
from agentrl_sdk.rollout.samples import with_advantages
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Batch, Sample

__all__ = [
    "critic_checkpoint_dir",
    "score_values",
    "start_critics",
    "stop_critics",
    "update_critic",
]

_UPDATE_METRICS = ("value_loss", "clip_fraction", "grad_norm", "lr", "time_s", "restarts")


def _prefix(name: str) -> str:
    return "critic/" if name == DEFAULT_POLICY else f"critic/{name}/"


def critic_checkpoint_dir(policy: Policy, root: str | Path) -> Path:
    """Where a policy's critic checkpoints live: ``critic/`` beside its own ``step_*`` ones."""
    return policy.checkpoint_dir(root) / "critic"


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


async def score_values(
    critics: Mapping[str, CriticGroup], estimator: Estimator, samples: list[Sample]
) -> tuple[list[Sample], dict[str, float]]:
    """Each sample with its critic's values, and the estimator's token advantages and
    returns from them (per policy, as it reads a critic's values: ``needs_values``).

    Metrics per policy: the estimator's under ``critic/`` (GAE: ``values_mean``,
    ``returns_mean``, ``explained_variance``, ``advantages_mean`` before whitening).
    """
    if not critics:
        return samples, {}
    out: list[Sample] = list(samples)
    metrics: dict[str, float] = {}
    for name, critic in critics.items():
        mine = [i for i, s in enumerate(samples) if s.policy == name]
        if not mine:
            continue
        own = [samples[i] for i in mine]
        values = padded(await run_blocking(critic.compute_values, Batch(samples=own)))
        estimate = estimator(Sequences.of(own, values=values))
        metrics |= {f"{_prefix(name)}{k}": v for k, v in estimate.metrics.items()}
        scored = with_advantages(own, estimate.advantages, values=values,
                                 returns=estimate.returns)  # fmt: skip
        for i, s in zip(mine, scored, strict=True):
            out[i] = s
    return out, metrics


async def update_critic(
    critic: CriticGroup, name: str, step: int, samples: list[Sample]
) -> dict[str, float]:
    """One critic update on a policy's scored samples (none: nothing)."""
    if not samples:
        return {}
    update = await run_blocking(critic.update, Batch(step=step, policy=name, samples=samples))
    return {f"{_prefix(name)}{k}": update[k] for k in _UPDATE_METRICS if k in update}
