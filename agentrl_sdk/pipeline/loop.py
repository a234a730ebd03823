"""The training loop: a rollouter streams scored groups into a bounded queue while the trainer
takes batches of them, updates and pushes its weights, within the schedule's staleness bound.

One loop for both pipelines (`rules.Schedule`): ``sync`` is this loop on-policy
(``max_staleness: 0``) with each step's rows started together, prefetched behind the weight gate
while the trainer updates; ``fully_async`` admits row by row and lets rollouts run ahead of the
trainer. Both sides run on the driver's event loop; the heavy work of each is elsewhere (the
engines' decode threads or servers, the trainer's Ray workers).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from rich.console import Console

from agentrl_sdk.engines.base import drop_prefix_caches
from agentrl_sdk.engines.gate import held
from agentrl_sdk.errors import EngineError
from agentrl_sdk.pipeline.checkpoints import PIPELINE_STATE, finish, maybe_resume, save_checkpoint
from agentrl_sdk.pipeline.evaluate import maybe_evaluate
from agentrl_sdk.pipeline.interrupts import Stopped, stop_on_interrupt, unless_stopped
from agentrl_sdk.pipeline.batch import GroupCredit, advantages, batch_samples, credit_rollouts
from agentrl_sdk.pipeline.job import Job, JobSpec
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.pipeline.progress import log_console, step_log, trace_step
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.pipeline.rollouter import Rollouter
from agentrl_sdk.pipeline.rules import Schedule, dynamic_sampling_metrics, staleness_metrics
from agentrl_sdk.pipeline.session import open_job
from agentrl_sdk.pipeline.trajectory_queue import FinishedGroup, GroupQueue, PipelineState
from agentrl_sdk.pipeline.update import critic_values, push_weights, update_policies
from agentrl_sdk.rollout import row_id_of
from agentrl_sdk.types import Sample

Taken = tuple[FinishedGroup, GroupCredit]
"""A group the trainer took, with its rollouts' credit (made once, as it was taken)."""

__all__ = ["run_fully_async", "run_pipeline", "run_sync"]


async def run_sync(spec: JobSpec, *, console: Console | None = None) -> TrainResult:
    """Train on-policy: each step rolls out a batch with the newest weights, then updates."""
    return await run_pipeline(spec, Schedule.of(spec.config, "sync"), console=console)


async def run_fully_async(spec: JobSpec, *, console: Console | None = None) -> TrainResult:
    """Train with rollouts and updates overlapped within ``fully_async.max_staleness``."""
    return await run_pipeline(spec, Schedule.of(spec.config, "fully_async"), console=console)


async def run_pipeline(
    spec: JobSpec, schedule: Schedule, *, console: Console | None = None
) -> TrainResult:
    """Train ``spec.config.max_steps`` updates of ``spec.graph`` on ``spec.rows``.

    The rollouter admits rows while ``schedule`` allows; the trainer takes ``batch_size``
    finished groups per update, drops (or re-runs) any that became too stale, and every
    ``sync_every`` updates pauses the engines, pushes its weights and resumes them (requests in
    flight continue with the new weights; each token records the version that sampled it). A
    stop (max steps, or Ctrl-C once) checkpoints the queue and the unfinished rows with the
    trainer when ``checkpoint.dir`` is set.
    """
    console = console or log_console()
    config = spec.config
    async with open_job(spec, console=console) as (job, result):
        start, folder = await maybe_resume(job, console)
        # Its steps are done and checkpointed: a run resumed at max_steps has nothing to save.
        result.steps, result.checkpoint = start, str(folder) if folder else None
        # The loader resumes after every row drawn; those not trained are in the state. A
        # checkpoint without one (an older sync run's) continues the row indices at its step.
        state = PipelineState(next_index=start * config.data.batch_size)
        if folder is not None and (folder / PIPELINE_STATE).exists():
            state = PipelineState.model_validate_json((folder / PIPELINE_STATE).read_text())
        queue = GroupQueue(schedule.queue_capacity())
        for group in state.queued:
            await queue.put(group)
        rollouter = Rollouter(job, queue, state, schedule, start)
        if start == 0:  # a resumed run evaluated its starting weights before
            await maybe_evaluate(job, result, 0, console)
        trainer = _Trainer(job, queue, rollouter, schedule)  # its clocks start with the rollouts
        rollouter.start()
        try:
            with stop_on_interrupt() as stop, step_log(job, result, console, start) as record:
                for step in range(start, config.max_steps):
                    if stop.is_set():
                        break
                    evaluate = functools.partial(maybe_evaluate, job, result, step + 1, console)
                    try:
                        metrics = await trainer.step(step, stop, evaluate)
                    except Stopped:  # while taking its batch: the groups went back to the queue
                        break
                    if record(step, metrics):
                        result.checkpoint = await trainer.checkpoint(step + 1)
        finally:
            await rollouter.stop()
        if stop.is_set():
            console.log(f"[yellow]stopped (Ctrl-C) after step {result.steps}: checkpointing")
            result.stopped = True
        if config.checkpoint.dir and result.steps > start:
            result.checkpoint = await trainer.checkpoint(result.steps)
        return await finish(job, result)


class _Trainer:
    """The consumer side: takes batches of fresh groups, updates, pushes weights."""

    def __init__(
        self, job: Job, queue: GroupQueue, rollouter: Rollouter, schedule: Schedule
    ) -> None:
        self.job = job
        self.queue = queue
        self.rollouter = rollouter
        self.schedule = schedule
        self.last_batch_at = self.served_at = time.perf_counter()
        self.repushes = 0

    async def step(
        self, step: int, stop: asyncio.Event, evaluate: Callable[[], Awaitable[None]]
    ) -> dict[str, float]:
        """One update on the next ``batch_size`` fresh groups; weights pushed when due, then
        ``evaluate`` before the prefetched rows start (an evaluation that shares the engines
        with them takes 3-6x as long, and delays them as much).
        Raises `Stopped` (the groups taken put back) if ``stop`` is set while it waits for them."""
        job, schedule = self.job, self.schedule
        waited = time.perf_counter()
        groups, flat = await self._take_batch(step, stop)
        now = time.perf_counter()
        # Taking turns (on-policy), a batch's rollouts ran since the weights were served;
        # overlapped, the rollout stage delivers a batch per period.
        rollout_s = now - (self.served_at if schedule.max_staleness == 0 else self.last_batch_at)
        wait_s, self.last_batch_at = now - waited, now
        # Groups without signal are logged and counted; the batch leaves their samples out.
        taken = sorted(groups + flat, key=lambda g: g[0].index)
        trajectories = [t for g, _ in taken for t in g.trajectories]
        config = job.config
        samples, metrics = await self._batch([credit for _, credit in taken])
        metrics = rollout_metrics(trajectories, rollout_s) | metrics
        metrics |= trace_step(job.run, config.tracking, step, trajectories, samples,
                              agg=config.algorithm.agg, tokenizer=job.tokenizer)
        for group, _ in taken:
            for key, value in group.counts.items():
                metrics[key] = metrics.get(key, 0.0) + value
        metrics |= staleness_metrics([g.staleness(step) for g, _ in groups])
        metrics |= dynamic_sampling_metrics(schedule, len(groups), len(flat))
        rollouter = self.rollouter
        metrics |= {
            "async/wait_s": wait_s,
            "async/queued_groups": float(len(self.queue)),
            "async/in_flight_groups": float(rollouter.in_flight),
            "async/dropped_stale": float(rollouter.dropped_stale),
            "async/retried_stale": float(rollouter.retried_stale),
            "async/dropped_no_signal": float(rollouter.dropped_no_signal),
            "async/engine_retries": float(rollouter.engine_retries),
            "async/repushes": float(self.repushes),
            "async/partial_rollouts": float(sum(g.mixed_versions for g, _ in groups)),
        }
        more = step + 1 < job.config.max_steps  # another update follows this one
        prefetch = schedule.prefetch and more
        with held(p.gate for p in self.job.policies.values() if prefetch):
            if prefetch:  # the next rows start, behind the closed gate
                await self.rollouter.served(step + 1)
            if schedule.idle_until_push(step):  # the cached keys would add to the update's peak
                await self._each_engine("drop their prefix caches",
                                        [drop_prefix_caches(p.engine for p in job.trained)])
            metrics |= await update_policies(job.trained, job.critics, step, samples,
                                             warmup_updates=config.critic.warmup_updates)
            if schedule.pushes_after(step):
                metrics |= await self._push(step + 1, serve=more)
            else:
                metrics["time/weight_sync_s"] = 0.0
            await evaluate()
        self.served_at = time.perf_counter()
        return metrics

    async def _batch(self, credits: list[GroupCredit]) -> tuple[list[Sample], dict[str, float]]:
        """The batch of the taken groups' credits: their samples, each critic's values of them
        (with a critic), the advantages; and the metrics of those."""
        algorithm = self.job.config.algorithm
        estimator = algorithm.estimator
        samples, extra, counts = batch_samples(
            credits, per_call=estimator.per_call, drop_flat=algorithm.dynamic_sampling.enabled
        )
        values = await critic_values(self.job.critics, samples)
        samples, metrics = advantages(samples, extra, estimator, values)
        return samples, metrics | counts

    async def _take_batch(
        self, step: int, stop: asyncio.Event
    ) -> tuple[list[Taken], list[Taken]]:
        """``batch_size`` groups fresh enough at ``step``, each credited as it is taken; older
        ones are dropped or rolled out again, as configured. With dynamic sampling, groups
        without signal are taken out too (returned second), up to the schedule's
        ``flat_budget``. Running ahead (``max_staleness`` >= 1), a second group of a row (the
        row again in the next epoch) waits for the next batch: a batch's samples of a row are
        one group to the estimator. On-policy, a step's rows are one loader batch, distinct,
        and the bound would leave no other row to wait for."""
        schedule, algorithm = self.schedule, self.job.config.algorithm
        trained = [p.name for p in self.job.trained]
        groups: list[Taken] = []
        flat: list[Taken] = []
        rows: set[str] = set()
        later: list[FinishedGroup] = []
        try:
            while len(groups) < schedule.batch_size:
                try:
                    group = await unless_stopped(self._next_group(step), stop)
                except Stopped:
                    self.queue.put_back([g for g, _ in groups])
                    raise
                if schedule.is_stale(group.staleness(step)):
                    await self.rollouter.discard(group, retry=schedule.retry_stale)
                    continue
                row = row_id_of(group.row)
                if schedule.max_staleness and row in rows:
                    later.append(group)
                    continue
                rows.add(row)
                credit = credit_rollouts(group.trajectories, policies=trained,
                                         outcome_weight=algorithm.outcome_reward_weight,
                                         drop_truncated=algorithm.overlong.drop_truncated)
                if schedule.flat_budget and not credit.has_signal:
                    # It does not count toward the batch; the slot it frees admits another row.
                    await self.rollouter.discard(group, retry=False, stale=False)
                    flat.append((group, credit))
                    if len(flat) == schedule.flat_budget:
                        break  # the bound: train on the groups with signal there are
                    continue
                groups.append((group, credit))
        finally:
            self.queue.put_back(later)
        return groups, flat

    async def _next_group(self, step: int) -> FinishedGroup:
        """The queue's next group; raises the rollouter's failure instead of waiting forever.

        An engine that failed under some rollouts gets the weights of ``step`` updates pushed
        again meanwhile: a rebuilt replica serves only once it holds them, and the rows that
        failed on it wait for them.
        """
        rollouter = self.rollouter
        getting = asyncio.ensure_future(self.queue.get())
        failed = asyncio.ensure_future(rollouter.engines_failed.wait())
        try:
            while not getting.done():
                if rollouter.failure is not None:
                    raise RuntimeError("the rollouter failed") from rollouter.failure
                if failed.done():
                    self.repushes += 1
                    await self._push(step, serve=True)
                    failed = asyncio.ensure_future(rollouter.engines_failed.wait())
                await asyncio.wait({getting, failed}, timeout=1.0,
                                   return_when=asyncio.FIRST_COMPLETED)
            return getting.result()
        except BaseException:  # stopped: a group taken in the same instant goes back
            if getting.done() and not getting.cancelled() and getting.exception() is None:
                self.queue.put_back([getting.result()])
            raise
        finally:
            getting.cancel()
            failed.cancel()

    async def _push(self, step: int, *, serve: bool) -> dict[str, float]:
        """Pause the engines (requests keep their partial output), push the weights after
        ``step`` updates, resume; then (``serve``) rows may be admitted against them."""
        trained = self.job.trained
        await self._each_engine("pause", [p.engine.pause() for p in trained])
        try:
            metrics = await push_weights(trained, step)
        finally:
            await self._each_engine("resume", [p.engine.resume() for p in trained])
        if serve:
            await self.rollouter.served(step)
        return metrics

    async def _each_engine(self, what: str, calls: list[Coroutine[Any, Any, None]]) -> None:
        """Await every engine's ``what`` call within the weight push's timeout: an engine that
        stopped answering fails the run with a reason instead of hanging it."""
        timeout_s = self.job.config.trainer.weight_sync_timeout_s
        try:
            await asyncio.wait_for(asyncio.gather(*calls), timeout_s)
        except TimeoutError as exc:
            raise EngineError(f"the engines did not {what} within trainer.weight_sync_timeout_s "
                              f"({timeout_s:g} s) around a weight push") from exc

    async def checkpoint(self, step: int) -> str:
        """The trainer after ``step`` updates, with the queue and the unfinished rows."""
        return await save_checkpoint(self.job, step, self.rollouter.state())
