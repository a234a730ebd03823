"""The fully-asynchronous pipeline: a rollouter streams scored groups into a bounded queue while
the trainer updates on them, within a staleness bound.

Both sides run on the driver's event loop; the heavy work of each is elsewhere (the engines'
decode threads or servers, the trainer's Ray workers), so an update and the rollouts of the
next batches proceed at the same time. Same job parts as the sync pipeline (`job.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from rich.console import Console

from agentrl_sdk.pipeline.evaluate import maybe_evaluate
from agentrl_sdk.pipeline.interrupts import Stopped, stop_on_interrupt, unless_stopped
from agentrl_sdk.pipeline.checkpoints import (
    PIPELINE_STATE,
    finish,
    maybe_resume,
    save_checkpoint,
)
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
from agentrl_sdk.pipeline.staleness import (
    may_admit,
    sampled_steps,
    staleness_metrics,
)
from agentrl_sdk.pipeline.trajectory_queue import (
    FinishedGroup,
    GroupQueue,
    PendingRow,
    PipelineState,
)
from agentrl_sdk.rollout import arollout

logger = logging.getLogger(__name__)

__all__ = ["run_fully_async"]


class Rollouter:
    """Admits rows as groups of ``n`` rollouts while the staleness bound allows, and puts each
    group in the queue once all its rollouts are scored.

    Args:
        job: The training job (engines, graph, rewards, loader).
        queue: Where finished groups go.
        state: Where to continue from (a resumed run's queue and unfinished rows).
        trained_groups: Groups already trained (``start_step * batch_size``).
    """

    def __init__(
        self,
        job: Job,
        queue: GroupQueue,
        state: PipelineState,
        *,
        trained_groups: int,
        served_step: int,
    ) -> None:
        self.job = job
        self.queue = queue
        self.served_step = served_step
        self.next_index = state.next_index
        self.dropped_stale = state.dropped_stale
        self.retried_stale = state.retried_stale
        self.dropped_no_signal = 0
        self.live = trained_groups + len(state.queued)  # started, not dropped
        self._rows: deque[PendingRow] = deque(sorted(state.pending, key=lambda p: p.index))
        self._in_flight: dict[int, tuple[PendingRow, asyncio.Task[None]]] = {}
        self._changed = asyncio.Condition()
        self._admitting: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None

    @property
    def in_flight(self) -> int:
        """Groups rolling out now."""
        return len(self._in_flight)

    def start(self) -> None:
        """Start admitting rows."""
        self._admitting = asyncio.ensure_future(self._admit_forever())

    async def served(self, step: int) -> None:
        """The engines now serve the weights of trainer step ``step``: admit more."""
        async with self._changed:
            self.served_step = step
            self._changed.notify_all()

    async def discard(self, group: FinishedGroup, retry: bool, *, stale: bool = True) -> None:
        """A group the trainer will not train (stale, or with no signal when not ``stale``):
        free its slot, maybe roll it out again."""
        async with self._changed:
            self.live -= 1
            if not stale:
                self.dropped_no_signal += 1
            elif retry:
                self.retried_stale += 1
                self._rows.appendleft(PendingRow(index=group.index, row=group.row))
            else:
                self.dropped_stale += 1
            self._changed.notify_all()

    def _may_admit(self) -> bool:
        config = self.job.config
        room = self.in_flight == 0 or (self.in_flight + 1) * config.rollout.n <= (
            config.rollout.concurrency
        )
        return room and may_admit(
            self.live, self.served_step, config.data.batch_size,
            config.fully_async.max_staleness,
        )  # fmt: skip

    async def _admit_forever(self) -> None:
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(self._may_admit)
                    pending = self._next_row()
                    self.live += 1
                    task = asyncio.ensure_future(self._roll_out(pending, self.served_step))
                    self._in_flight[pending.index] = (pending, task)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to the trainer, which would wait forever
            self.failure = exc
            raise

    def _next_row(self) -> PendingRow:
        if not self._rows:
            for row in self.job.loader.next_batch():
                self._rows.append(PendingRow(index=self.next_index, row=row))
                self.next_index += 1
        return self._rows.popleft()

    async def _roll_out(self, pending: PendingRow, admitted_step: int) -> None:
        job = self.job
        try:
            step_seed = pending.index // job.config.data.batch_size  # the sync pipeline's step
            trajectories = await arollout(
                job.graph, pending.row, job.engines, tokenizer=job.tokenizer,
                config=rollout_config(job.config, step_seed), input_fn=job.input_fn,
                record_events=job.traced,
            )  # fmt: skip
            counts = await score_rollouts(job, trajectories, [pending.row])
            counts |= shape_rewards(job, trajectories)
            trained = [p.name for p in job.trained]
            steps = sampled_steps(trajectories, trained)
            mixed = sum(len(sampled_steps([t], trained)) > 1 for t in trajectories)
            group = FinishedGroup(
                index=pending.index, row=pending.row, trajectories=trajectories, counts=counts,
                admitted_step=admitted_step, oldest_step=steps[0] if steps else admitted_step,
                mixed_versions=mixed,
            )  # fmt: skip
            await self.queue.put(group)
        except asyncio.CancelledError:
            self._rows.appendleft(pending)  # stopped: a resumed run rolls it out again
            self.live -= 1
            raise
        except BaseException as exc:
            self.failure = exc
            logger.exception("the rollouts of row index %d failed", pending.index)
        finally:
            self._in_flight.pop(pending.index, None)
            async with self._changed:
                self._changed.notify_all()

    def state(self) -> PipelineState:
        """What a checkpoint keeps: the queue, and every drawn row whose group has not finished
        (in flight or not admitted yet), to roll out again after a resume."""
        unfinished = [pending for pending, _ in self._in_flight.values()] + list(self._rows)
        return PipelineState(
            next_index=self.next_index,
            queued=[g.model_copy(update={"trajectories": list(g.trajectories)})
                    for g in self.queue.snapshot()],
            pending=sorted(unfinished, key=lambda p: p.index),
            dropped_stale=self.dropped_stale,
            retried_stale=self.retried_stale,
        )  # fmt: skip

    async def stop(self) -> None:
        """Stop admitting and cancel the groups in flight (their rows stay in `state`)."""
        tasks = [t for t in (self._admitting,) if t is not None]
        tasks += [task for _, task in self._in_flight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_fully_async(spec: JobSpec, *, console: Console | None = None) -> TrainResult:
    """Train ``spec.config.max_steps`` updates of ``spec.graph`` with rollouts and updates
    overlapped.

    The rollouter keeps admitting rows while ``fully_async.max_staleness`` allows; the
    trainer takes ``data.batch_size`` finished groups per update, drops (or re-runs) any that
    became too stale, and every ``fully_async.sync_every`` updates pauses the engines, pushes
    its weights and resumes them (requests in flight continue with the new weights; each
    token records the version that sampled it). A stop (max steps, or Ctrl-C once) checkpoints
    the queue and the unfinished rows with the trainer when ``checkpoint.dir`` is set.
    """
    console = console or Console()
    config = spec.config
    async with open_job(spec, console=console) as (job, result):
        start, folder = await maybe_resume(job, console)
        state = PipelineState()
        if folder is not None and (folder / PIPELINE_STATE).exists():
            # The loader resumes after every row drawn; those not trained are in the state.
            state = PipelineState.model_validate_json((folder / PIPELINE_STATE).read_text())
        queue = GroupQueue(config.data.batch_size * (config.fully_async.max_staleness + 1))
        for group in state.queued:
            await queue.put(group)
        rollouter = Rollouter(
            job, queue, state,
            trained_groups=start * config.data.batch_size, served_step=start,
        )  # fmt: skip
        trainer = _Trainer(job, queue, rollouter)
        if start == 0:  # a resumed run evaluated its starting weights before
            await maybe_evaluate(job, result, 0, console)
        rollouter.start()
        try:
            with stop_on_interrupt() as stop, step_log(job, result, console, start) as record:
                for step in range(start, config.max_steps):
                    if stop.is_set():
                        break
                    try:
                        metrics = await trainer.step(step, stop)
                    except Stopped:  # while taking its batch: the groups went back to the queue
                        break
                    if record(step, metrics):
                        result.checkpoint = await trainer.checkpoint(step + 1)
                    await maybe_evaluate(job, result, step + 1, console)
        finally:
            await rollouter.stop()
        if stop.is_set():
            console.log(f"[yellow]stopped (Ctrl-C) after step {result.steps}: checkpointing "
                        "the queue")
            result.stopped = True
        if config.checkpoint.dir and result.steps > start:
            result.checkpoint = await trainer.checkpoint(result.steps)
        return await finish(job, result, job.run)


class _Trainer:
    """The trainer side: takes batches of fresh groups, updates, pushes weights."""

    def __init__(self, job: Job, queue: GroupQueue, rollouter: Rollouter) -> None:
        self.job = job
        self.queue = queue
        self.rollouter = rollouter
        self.last_batch_at = time.perf_counter()

    async def step(self, step: int, stop: asyncio.Event) -> dict[str, float]:
        """One update on the next ``batch_size`` fresh groups; weights pushed when due.
        Raises `Stopped` (the groups taken put back) if ``stop`` is set while it waits for them."""
        config = self.job.config
        waited = time.perf_counter()
        groups, flat = await self._take_batch(step, stop)
        now = time.perf_counter()
        wait_s, period_s, self.last_batch_at = now - waited, now - self.last_batch_at, now
        # Groups without signal are logged and counted; build_samples drops them.
        taken = sorted(groups + flat, key=lambda g: g.index)
        trajectories = [t for g in taken for t in g.trajectories]
        samples, metrics = await batch_samples(self.job, trajectories, period_s)
        metrics |= trace_step(self.job, step, trajectories, samples)
        for group in taken:
            for key, value in group.counts.items():
                metrics[key] = metrics.get(key, 0.0) + value
        metrics |= staleness_metrics([g.staleness(step) for g in groups])
        metrics |= {
            "async/wait_s": wait_s,
            "async/queued_groups": float(len(self.queue)),
            "async/in_flight_groups": float(self.rollouter.in_flight),
            "async/dropped_stale": float(self.rollouter.dropped_stale),
            "async/retried_stale": float(self.rollouter.retried_stale),
            "async/dropped_no_signal": float(self.rollouter.dropped_no_signal),
            "async/partial_rollouts": float(sum(g.mixed_versions for g in groups)),
        }
        metrics |= await update_policies(self.job, step, samples)
        if (step + 1) % config.fully_async.sync_every == 0:
            metrics |= await self._push(step + 1)
        else:
            metrics["time/weight_sync_s"] = 0.0
        return metrics

    async def _take_batch(
        self, step: int, stop: asyncio.Event
    ) -> tuple[list[FinishedGroup], list[FinishedGroup]]:
        """``batch_size`` groups at most ``max_staleness`` old at ``step``; older ones are
        dropped or rolled out again, as configured. With dynamic sampling, groups without
        signal are taken out too (returned second), up to ``max_extra_rounds`` batches of them."""
        settings, config = self.job.config.fully_async, self.job.config
        sampling = config.algorithm.dynamic_sampling
        may_drop = sampling.max_extra_rounds * config.data.batch_size if sampling.enabled else 0
        groups: list[FinishedGroup] = []
        flat: list[FinishedGroup] = []
        while len(groups) < config.data.batch_size:
            try:
                group = await unless_stopped(self._next_group(), stop)
            except Stopped:
                self.queue.put_back(groups)
                raise
            if group.staleness(step) > settings.max_staleness:
                await self.rollouter.discard(group, retry=settings.on_stale == "retry")
                continue
            if may_drop and not rows_with_signal(self.job, group.trajectories):
                # Dynamic sampling: it does not count toward the batch; the slot it frees
                # lets the rollouter admit another row.
                await self.rollouter.discard(group, retry=False, stale=False)
                flat.append(group)
                if len(flat) == may_drop:
                    break  # the bound: train on the groups with signal there are
                continue
            groups.append(group)
        return groups, flat

    async def _next_group(self) -> FinishedGroup:
        """The queue's next group; raises the rollouter's failure instead of waiting forever."""
        getting = asyncio.ensure_future(self.queue.get())
        try:
            while not getting.done():
                if self.rollouter.failure is not None:
                    raise RuntimeError("the rollouter failed") from self.rollouter.failure
                await asyncio.wait({getting}, timeout=1.0)
            return getting.result()
        except BaseException:  # stopped: a group taken in the same instant goes back
            if getting.done() and not getting.cancelled() and getting.exception() is None:
                self.queue.put_back([getting.result()])
            raise
        finally:
            getting.cancel()

    async def _push(self, step: int) -> dict[str, float]:
        """Pause the engines (requests keep their partial output), push the weights after
        ``step`` updates, resume; then the rollouter may admit against the new version."""
        trained = self.job.trained
        await asyncio.gather(*(p.engine.pause() for p in trained))
        try:
            metrics = await push_weights(self.job, step)
        finally:
            await asyncio.gather(*(p.engine.resume() for p in trained))
        await self.rollouter.served(step)
        return metrics

    async def checkpoint(self, step: int) -> str:
        """The trainer after ``step`` updates, with the queue and the unfinished rows."""
        return await save_checkpoint(
            self.job, step, self.job.loader.position, self.rollouter.state()
        )
