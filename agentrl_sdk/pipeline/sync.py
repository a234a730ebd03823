"""The synchronous pipeline: rollouts -> rewards -> advantages -> update -> weight sync, repeat."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from agentrl_sdk.data import LoaderPosition
from agentrl_sdk.pipeline.checkpoints import finish, maybe_resume, save_checkpoint
from agentrl_sdk.pipeline.evaluate import maybe_evaluate
from agentrl_sdk.pipeline.interrupts import Stopped, stop_on_interrupt, unless_stopped
from agentrl_sdk.pipeline.job import (
    Job,
    JobSpec,
    batch_samples,
    open_job,
    push_weights,
    rollout_config,
    rows_with_signal,
    score_rollouts,
    shape_rewards,
    trace_step,
    update_policies,
)
from agentrl_sdk.pipeline.progress import step_log
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.rollout import arollout_batch, row_id_of
from agentrl_sdk.types import Trajectory


@dataclass
class _Rollouts:
    """One step's rollouts in flight, and the loader position from before its rows."""

    step: int
    rows: list[dict[str, Any]]
    position: LoaderPosition
    task: asyncio.Future[list[Trajectory]]
    started: float


async def run_sync(spec: JobSpec, *, console: Console | None = None) -> TrainResult:
    """Train ``spec.config.max_steps`` policy updates of ``spec.graph`` on ``spec.rows``."""
    console = console or Console()
    config = spec.config
    pending: _Rollouts | None = None
    async with open_job(spec, console=console) as (job, result):
        try:
            start, _ = await maybe_resume(job, console)
            if start == 0:  # a resumed run evaluated its starting weights before
                await maybe_evaluate(job, result, 0, console)
            with stop_on_interrupt() as stop, step_log(job, result, console, start) as record:
                for step in range(start, config.max_steps):
                    if stop.is_set():
                        break
                    current = pending or _start_rollouts(job, step)
                    pending = None
                    prefetch = config.prefetch_rollouts and step + 1 < config.max_steps
                    try:
                        metrics, pending = await _step(job, current, prefetch=prefetch, stop=stop)
                    except Stopped:  # during its rollouts: they are dropped, done again later
                        job.loader.position = current.position
                        break
                    if record(step, metrics):
                        position = pending.position if pending else job.loader.position
                        result.checkpoint = await save_checkpoint(job, step + 1, position)
                    await maybe_evaluate(job, result, step + 1, console)
            if stop.is_set():
                if pending:  # prefetched rollouts of a step that will not run now
                    job.loader.position = pending.position
                    await _cancel(pending)
                    pending = None
                console.log(f"[yellow]stopped (Ctrl-C) after step {result.steps}: checkpointing")
                result.stopped = True
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
    job: Job, current: _Rollouts, *, prefetch: bool, stop: asyncio.Event
) -> tuple[dict[str, float], _Rollouts | None]:
    """One policy update: rollouts, rewards, advantages, update, weight sync.

    With ``prefetch``, the next step's rollouts start behind the closed gate once this
    step's batch is scored, and the gate opens after the weight sync; they are returned.
    Raises `Stopped` if ``stop`` is set while the step's rollouts run.
    """
    trajectories = await unless_stopped(current.task, stop)
    # Sampling time only: a prefetched step's rollouts wait at the gate until it opens.
    opened = max(p.gate.opened_at for p in job.policies.values())
    rollout_s = time.perf_counter() - max(current.started, opened)
    counts = Counter(await score_rollouts(job, trajectories, current.rows))
    counts.update(shape_rewards(job, trajectories))
    surplus: list[str] = []
    if job.config.algorithm.dynamic_sampling.enabled:
        started = time.perf_counter()
        trajectories, surplus, filled = await _fill_batch(job, current, trajectories)
        rollout_s += time.perf_counter() - started
        counts.update(filled)
    samples, metrics = await batch_samples(job, trajectories, rollout_s, surplus)
    metrics.update(trace_step(job, current.step, trajectories, samples))
    metrics.update(counts)
    upcoming = None
    if prefetch:
        for policy in job.policies.values():
            policy.gate.hold()
        upcoming = _start_rollouts(job, current.step + 1)
    try:
        metrics.update(await update_policies(job, current.step, samples))
        metrics.update(await push_weights(job, current.step + 1))
    except BaseException:
        if upcoming:
            await _cancel(upcoming)
        raise
    finally:
        for policy in job.policies.values():
            policy.gate.release()
    return metrics, upcoming


async def _fill_batch(
    job: Job, current: _Rollouts, trajectories: list[Trajectory]
) -> tuple[list[Trajectory], list[str], dict[str, float]]:
    """Dynamic sampling: roll out more batches of rows until ``data.batch_size`` rows have
    signal, at most ``max_extra_rounds`` of them.

    Returns every rollout (all are logged), the surplus rows with signal past the first
    ``batch_size`` (not trained on) and the step's counts and ``dynamic_sampling/...`` metrics.
    """
    config = job.config
    batch_size, rounds = config.data.batch_size, 0
    counts: Counter[str] = Counter({"count/rows_sampled": float(len(current.rows))})
    signal = rows_with_signal(job, trajectories)
    while len(signal) < batch_size and rounds < config.algorithm.dynamic_sampling.max_extra_rounds:
        rounds += 1
        seen = {t.row_id for t in trajectories}
        # A small dataset can wrap within a step: a row is rolled out once per step.
        rows = [r for r in job.loader.next_batch() if row_id_of(r) not in seen]
        more = await arollout_batch(
            job.graph, rows, job.engines, tokenizer=job.tokenizer,
            config=rollout_config(config, current.step), input_fn=job.input_fn,
            record_events=job.traced,
        )  # fmt: skip
        counts.update(await score_rollouts(job, more, rows))
        counts.update(shape_rewards(job, more))
        counts["count/rows_sampled"] += len(rows)
        trajectories = trajectories + more
        signal = rows_with_signal(job, trajectories)
    return trajectories, signal[batch_size:], {
        **counts, "dynamic_sampling/extra_rounds": float(rounds),
        "dynamic_sampling/rows_with_signal": float(len(signal)),
    }
