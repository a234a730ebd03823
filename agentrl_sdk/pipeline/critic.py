"""PPO with a critic in the pipelines: a value model per trained policy, token advantages (GAE)
from its values before an update, and its own update after the policy's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl_sdk.algorithms import compute_gae, explained_variance, masked_whiten
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.policies import DEFAULT_POLICY, Policy, trainer_options
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Batch, Sample

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.job import Job

__all__ = [
    "critic_checkpoint_dir",
    "score_values",
    "start_critics",
    "stop_critics",
    "update_critic",
]

_UPDATE_METRICS = ("value_loss", "clip_fraction", "grad_norm", "lr", "time_s", "restarts")


def uses_critic(config: TrainConfig) -> bool:
    """Whether the job trains value models (``advantage_estimator: gae``)."""
    return config.algorithm.advantage_estimator == "gae"


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
    if not uses_critic(config):
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


async def score_values(job: Job, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
    """Each sample with its critic's values, GAE token advantages and returns (per policy).

    A sample's advantage (``Sample.advantage``, what traces show) becomes the mean of its
    token advantages. Metrics per policy: ``critic/values_mean``, ``critic/returns_mean``,
    ``critic/explained_variance`` (of the returns by these values) and
    ``critic/advantages_mean`` (before whitening).
    """
    if not job.critics:
        return samples, {}
    gae = job.config.algorithm.gae
    out: list[Sample] = list(samples)
    metrics: dict[str, float] = {}
    for name, critic in job.critics.items():
        mine = [i for i, s in enumerate(samples) if s.policy == name]
        if not mine:
            continue
        own = [samples[i] for i in mine]
        values = await run_blocking(critic.compute_values, Batch(samples=own))
        v, mask = _padded([list(x) for x in values]), _padded([s.response_mask for s in own])
        rewards = torch.tensor([s.reward for s in own], dtype=torch.float32)
        adv, ret = compute_gae(rewards, v, mask, gae.gamma, gae.lam)  # (B, T)
        keep = mask.bool()
        prefix = _prefix(name)
        metrics |= {
            f"{prefix}values_mean": _masked_mean(v, keep),
            f"{prefix}returns_mean": _masked_mean(ret, keep),
            f"{prefix}advantages_mean": _masked_mean(adv, keep),
        }
        ev = explained_variance(v, ret, mask)
        if not math.isnan(ev):  # returns that do not vary leave nothing to explain
            metrics[f"{prefix}explained_variance"] = ev
        if gae.whiten:
            adv = masked_whiten(adv, mask)
        for row, (i, s) in enumerate(zip(mine, own, strict=True)):
            n = len(s.response_ids)
            token_adv = adv[row, :n].tolist()
            trained = keep[row, :n]
            out[i] = s.model_copy(update={
                "values": v[row, :n].tolist(), "returns": ret[row, :n].tolist(),
                "token_advantages": token_adv,
                "advantage": float(adv[row, :n][trained].mean()) if trained.any() else 0.0,
            })  # fmt: skip
    return out, metrics


async def update_critic(
    critic: CriticGroup, name: str, step: int, samples: list[Sample]
) -> dict[str, float]:
    """One critic update on a policy's scored samples (none: nothing)."""
    if not samples:
        return {}
    update = await run_blocking(critic.update, Batch(step=step, policy=name, samples=samples))
    return {f"{_prefix(name)}{k}": update[k] for k in _UPDATE_METRICS if k in update}


def _padded(rows: list[list[float]] | list[list[int]]) -> torch.Tensor:
    """``(B, T)`` float32, right-padded with 0 (T at least 1)."""
    width = max([1, *map(len, rows)])
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def _masked_mean(x: torch.Tensor, keep: torch.Tensor) -> float:
    return float(x[keep].mean()) if keep.any() else 0.0
