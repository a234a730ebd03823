"""The trainers' part of a step: critics' values, each policy's then critic's update, the push."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from torch import Tensor

from agentrl_sdk.algorithms.estimators import padded
from agentrl_sdk.pipeline.policies import Policy, metric_prefix
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Batch, Sample

__all__ = ["critic_values", "push_weights", "update_policies", "update_policy"]

_CRITIC_METRICS = ("value_loss", "clip_fraction", "grad_norm", "lr", "time_s", "restarts")


async def update_policies(
    trained: Sequence[Policy],
    critics: Mapping[str, CriticGroup],
    step: int,
    samples: list[Sample],
    *,
    warmup_updates: int = 0,
) -> dict[str, float]:
    """Every trained policy's update on its own samples, concurrently, then every critic's;
    plus ``time/train_s``. In the first ``warmup_updates`` steps only the critics train.

    The critics wait for the policies: a critic's and a policy's batch sent to their Ray
    actors from two threads at once crashed Ray's driver (an object id created twice).
    """
    started = time.perf_counter()
    warmup = bool(critics) and step < warmup_updates
    own = {p.name: [s for s in samples if s.policy == p.name] for p in trained}
    updates = await asyncio.gather(*(
        update_policy(policy, step, own[policy.name]) for policy in trained if not warmup
    ))  # fmt: skip
    for name, critic in critics.items():
        if own.get(name):
            update = await run_blocking(critic.update, Batch(step=step, policy=name,
                                                             samples=own[name]))
            prefix = metric_prefix("critic", name)
            updates.append({f"{prefix}{k}": update[k] for k in _CRITIC_METRICS if k in update})
    metrics = {k: v for update in updates for k, v in update.items()}
    if critics:
        metrics["critic/warmup"] = float(warmup)
    metrics["time/train_s"] = time.perf_counter() - started
    return metrics


async def push_weights(trained: Sequence[Policy], version: int) -> dict[str, float]:
    """Push every trained policy's weights to its engine as ``version`` (the updates they
    have seen); the versions, the bytes each push moved (``weight_sync/bytes``: an adapter's
    with ``trainer.lora.sync=adapter``) and the time."""
    started = time.perf_counter()
    metrics: dict[str, float] = {}
    for policy in trained:
        stats = await policy.weight_sync.push(policy.group.weights, [policy.engine], version)
        metrics[policy.prefix("policy_version").rstrip("/")] = float(stats.version)
        metrics[f"{policy.prefix('weight_sync')}bytes"] = float(stats.bytes)
    metrics["time/weight_sync_s"] = time.perf_counter() - started
    return metrics


async def update_policy(policy: Policy, step: int, samples: list[Sample]) -> dict[str, float]:
    """One policy's update on its samples (none: no update, nothing logged).

    A batch in which no token has an advantage (every group's rewards agreed) takes no
    optimizer step, counted as ``train/skipped_no_signal``: with nothing to learn, AdamW's
    momentum and decay would still move the weights.
    """
    if not samples:
        return {}
    prefix = policy.prefix("train")
    if not any(s.carries_signal for s in samples):
        return {f"{prefix}skipped_no_signal": 1.0, f"{prefix}optimizer_steps": 0.0}
    update = await run_blocking(policy.group.update, Batch(step=step, samples=samples))
    return {f"{prefix}{k}": v for k, v in update.items()} | {f"{prefix}skipped_no_signal": 0.0}


async def critic_values(
    critics: Mapping[str, CriticGroup], samples: list[Sample]
) -> dict[str, Tensor]:
    """Each critic's ``(M, T)`` values of its policy's samples, in order (a policy without
    samples: none); the estimator reads them (`batch.advantages`)."""
    values: dict[str, Tensor] = {}
    for name, critic in critics.items():
        if own := [s for s in samples if s.policy == name]:
            values[name] = padded(await run_blocking(critic.compute_values, Batch(samples=own)))
    return values
