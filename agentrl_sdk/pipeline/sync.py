"""The synchronous pipeline: rollouts -> rewards -> advantages -> update -> weight sync, repeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from agentrl_sdk.data import LoaderPosition
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.evaluate import maybe_evaluate
from agentrl_sdk.pipeline.job import (
    Job,
    TrainResult,
    batch_samples,
    finish,
    maybe_resume,
    open_job,
    push_weights,
    rollout_config,
    save_checkpoint,
    score_rollouts,
    step_log,
    update_policies,
)
from agentrl_sdk.rollout import arollout_batch, default_input
from agentrl_sdk.rollout.rewards import RewardFn
from agentrl_sdk.types import Trajectory


@dataclass
class _Rollouts:
    """One step's rollouts in flight, and the loader position from before its rows."""

    step: int
    rows: list[dict[str, Any]]
    position: LoaderPosition
    task: asyncio.Future[list[Trajectory]]
    started: float


async def run_sync(
    graph: Any,
    rows: list[dict[str, Any]],
    reward_fn: RewardFn | None,
    config: TrainConfig,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    console: Console | None = None,
    skipped_rows: int = 0,
    eval_rows: list[dict[str, Any]] | None = None,
) -> TrainResult:
    """Train ``config.max_steps`` policy updates of ``graph`` on ``rows``.

    ``skipped_rows`` (dataset rows that failed validation) is reported and logged;
    ``eval_rows`` are the held-out rows ``config.evaluation`` evaluates on.
    """
    console = console or Console()
    pending: _Rollouts | None = None
    async with open_job(
        graph, rows, reward_fn, config, input_fn=input_fn, console=console,
        skipped_rows=skipped_rows, eval_rows=eval_rows,
    ) as (job, result):  # fmt: skip
        try:
            start, _ = await maybe_resume(job, console)
            if start == 0:  # a resumed run evaluated its starting weights before
                await maybe_evaluate(job, result, 0, console)
            with step_log(job, result, console, start) as record:
                for step in range(start, config.max_steps):
                    current = pending or _start_rollouts(job, step)
                    pending = None
                    prefetch = config.prefetch_rollouts and step + 1 < config.max_steps
                    metrics, pending = await _step(job, current, prefetch=prefetch)
                    if record(step, metrics):
                        position = pending.position if pending else job.loader.position
                        result.checkpoint = await save_checkpoint(job, step + 1, position)
                    await maybe_evaluate(job, result, step + 1, console)
            return await finish(job, result, job.run)
        finally:
            if pending:
                await _cancel(pending)


def _start_rollouts(job: Job, step: int) -> _Rollouts:
    """Draw the step's rows and start their rollouts through the gates (waiting while held)."""
    position = job.loader.position
    rows = job.loader.next_batch()
    task = asyncio.ensure_future(arollout_batch(
        job.graph, rows, job.engines, tokenizer=job.tokenizer,
        config=rollout_config(job.config, step), input_fn=job.input_fn, record_events=job.traced,
    ))  # fmt: skip
    return _Rollouts(step, rows, position, task, time.perf_counter())


async def _cancel(rollouts: _Rollouts) -> None:
    rollouts.task.cancel()
    await asyncio.gather(rollouts.task, return_exceptions=True)


async def _step(
    job: Job, current: _Rollouts, *, prefetch: bool
) -> tuple[dict[str, float], _Rollouts | None]:
    """One policy update: rollouts, rewards, advantages, update, weight sync.

    With ``prefetch``, the next step's rollouts start behind the closed gate once this
    step's batch is scored, and the gate opens after the weight sync; they are returned.
    """
    trajectories = await current.task
    # Sampling time only: a prefetched step's rollouts wait at the gate until it opens.
    opened = max(p.gate.opened_at for p in job.policies.values())
    rollout_s = time.perf_counter() - max(current.started, opened)
    counts = await score_rollouts(job, trajectories, current.rows)
    samples, metrics = batch_samples(job, current.step, trajectories, rollout_s)
    metrics.update(counts)
    upcoming = None
    if prefetch:
        for policy in job.policies.values():
            policy.gate.hold()
        upcoming = _start_rollouts(job, current.step + 1)
    try:
        metrics.update(await update_policies(job, current.step, samples))
        metrics.update(await push_weights(job))
    except BaseException:
        if upcoming:
            await _cancel(upcoming)
        raise
    finally:
        for policy in job.policies.values():
            policy.gate.release()
    return metrics, upcoming
