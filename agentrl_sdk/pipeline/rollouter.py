"""The producer side of the pipeline: admits rows as the schedule allows, rolls them out, scores
them and puts each row's finished group in the queue the trainer takes batches from."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from agentrl_sdk.pipeline.job import Job
from agentrl_sdk.pipeline.rules import (
    Schedule,
    rollout_config,
    rows_to_admit,
    sampled_steps,
    seed_step,
)
from agentrl_sdk.pipeline.trajectory_queue import (
    FinishedGroup,
    GroupQueue,
    PendingRow,
    PipelineState,
)
from agentrl_sdk.rollout import arollout_batch, row_id_of
from agentrl_sdk.rollout.overlong import add_overlong_penalties
from agentrl_sdk.rollout.rewards import score
from agentrl_sdk.types import Trajectory

logger = logging.getLogger(__name__)

__all__ = ["Rollouter", "score_rollouts"]


class Rollouter:
    """Admits rows as groups of ``n`` rollouts while the schedule allows, and puts each group in
    the queue once its rollouts are scored.

    A row whose rollouts failed because an engine did (``engine_error``: it died, the pool is
    rebuilding it) is not scored: it waits, with admission paused, until weights are served
    again (`served`; `engines_failed` asks the trainer to push them now, which also lets a
    rebuilt replica rejoin), then rolls out again, up to ``schedule.engine_retries`` times.

    Args:
        job: The training job (engines, graph, rewards, loader).
        queue: Where finished groups go.
        state: Where to continue from (a resumed run's queue and unfinished rows).
        schedule: The admission rules.
        start: The updates already done (a resumed run's): their groups are trained, and the
            engines serve the weights after them.
    """

    def __init__(
        self, job: Job, queue: GroupQueue, state: PipelineState, schedule: Schedule, start: int
    ) -> None:
        self.job = job
        self.queue = queue
        self.schedule = schedule
        self.served_step = start
        self.next_index = state.next_index
        self.dropped_stale = state.dropped_stale
        self.retried_stale = state.retried_stale
        self.engine_retries = state.engine_retries
        self.engines_failed = asyncio.Event()
        self.dropped_no_signal = 0
        self.live = start * schedule.batch_size + len(state.queued)  # started, not dropped
        self._rows: deque[PendingRow] = deque(sorted(state.pending, key=lambda p: p.index))
        self._after_push: list[PendingRow] = []  # their engine failed: wait for the weights
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
        """Rows admitted from now on are sampled with the weights of trainer step ``step``."""
        async with self._changed:
            self.served_step = step
            self.engines_failed.clear()  # the push reached the rebuilt engines too
            self._rows.extendleft(sorted(self._after_push, key=lambda p: p.index, reverse=True))
            self._after_push.clear()
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

    def _room(self) -> int:
        if self._after_push:  # an engine failed: new rows would fail on it too
            return 0
        return rows_to_admit(self.schedule, self.live, self.in_flight, self.served_step)

    async def _admit_forever(self) -> None:
        try:
            while True:
                async with self._changed:
                    room = await self._changed.wait_for(self._room)
                    unit = self._next_rows(room)
                    self.live += len(unit)
                    task = asyncio.ensure_future(self._roll_out(unit, self.served_step))
                    for pending in unit:
                        self._in_flight[pending.index] = (pending, task)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to the trainer, which would wait forever
            self.failure = exc
            raise

    def _next_rows(self, count: int) -> list[PendingRow]:
        """Up to ``count`` rows: those waiting (resumed, retried) first, then the loader's."""
        if not self._rows:
            for row in self.job.loader.next_batch():
                self._rows.append(PendingRow(index=self.next_index, row=row))
                self.next_index += 1
        return [self._rows.popleft() for _ in range(min(count, len(self._rows)))]

    async def _roll_out(self, unit: list[PendingRow], admitted_step: int) -> None:
        job = self.job
        try:
            seed = seed_step(unit[0].index, self.schedule.batch_size)
            trajectories = await arollout_batch(
                job.graph, [p.row for p in unit], job.engines, tokenizer=job.tokenizer,
                config=rollout_config(job.config, seed), input_fn=job.input_fn,
                record_events=job.traced,
            )  # fmt: skip
            n = self.schedule.n  # arollout_batch: n per row, in row order
            by_row = [(p, trajectories[i * n:(i + 1) * n]) for i, p in enumerate(unit)]
            by_row = [(p, rows) for p, rows in by_row if not await self._engine_failed(p, rows)]
            groups = await asyncio.gather(
                *(self._finished(p, rows, admitted_step) for p, rows in by_row)
            )
            for group in groups:
                await self.queue.put(group)
                self._in_flight.pop(group.index, None)  # queued now: the state keeps it there
        except asyncio.CancelledError:
            # Stopped: a resumed run rolls the rows not queued yet out again.
            rest = [p for p in unit if p.index in self._in_flight]
            self._rows.extendleft(reversed(rest))
            self.live -= len(rest)
            raise
        except BaseException as exc:
            self.failure = exc
            logger.exception("the rollouts of row indices %s failed", [p.index for p in unit])
        finally:
            for pending in unit:
                self._in_flight.pop(pending.index, None)
            async with self._changed:
                self._changed.notify_all()

    async def _engine_failed(self, pending: PendingRow, trajectories: list[Trajectory]) -> bool:
        """Whether the row goes back to wait for the weights (an engine failed under it, and
        it has retries left) instead of being scored."""
        failed = any(t.status == "engine_error" for t in trajectories)
        if not failed or pending.engine_retries >= self.schedule.engine_retries:
            return False
        async with self._changed:
            self._in_flight.pop(pending.index, None)
            self.live -= 1
            self.engine_retries += 1
            retry = pending.model_copy(update={"engine_retries": pending.engine_retries + 1})
            self._after_push.append(retry)
            self.engines_failed.set()
        logger.warning("row %d: an engine failed under its rollouts; it runs again on the "
                       "weights pushed next", pending.index)
        return True

    async def _finished(
        self, pending: PendingRow, trajectories: list[Trajectory], admitted_step: int
    ) -> FinishedGroup:
        """A row's rollouts, scored (and over-long ones penalised, when configured), as the
        group the trainer takes."""
        job, config = self.job, self.job.config
        counts = await score_rollouts(job, trajectories, [pending.row])
        overlong = config.algorithm.overlong
        if overlong.buffer:  # training's reward shaping (evaluations score without it)
            penalised = add_overlong_penalties(
                trajectories, max_length=config.rollout.sampling.max_tokens,
                buffer=overlong.buffer, penalty=overlong.penalty,
            )  # fmt: skip
            counts["count/overlong_penalised_calls"] = float(penalised)
        trained = [p.name for p in job.trained]
        steps = sampled_steps(trajectories, trained)
        return FinishedGroup(
            index=pending.index, row=pending.row, trajectories=trajectories, counts=counts,
            admitted_step=admitted_step, oldest_step=steps[0] if steps else admitted_step,
            mixed_versions=sum(len(sampled_steps([t], trained)) > 1 for t in trajectories),
        )  # fmt: skip

    def state(self) -> PipelineState:
        """What a checkpoint keeps: the queue, and every drawn row whose group has not finished
        (in flight or not admitted yet), to roll out again after a resume."""
        unfinished = [pending for pending, _ in self._in_flight.values()]
        unfinished += [*self._rows, *self._after_push]
        return PipelineState(
            next_index=self.next_index,
            queued=[g.model_copy(update={"trajectories": list(g.trajectories)})
                    for g in self.queue.snapshot()],
            pending=sorted(unfinished, key=lambda p: p.index),
            dropped_stale=self.dropped_stale,
            retried_stale=self.retried_stale,
            engine_retries=self.engine_retries,
        )  # fmt: skip

    async def stop(self) -> None:
        """Stop admitting and cancel the groups in flight (their rows stay in `state`)."""
        tasks = {t for t in (self._admitting,) if t is not None}
        tasks |= {task for _, task in self._in_flight.values()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def score_rollouts(
    job: Job, trajectories: list[Trajectory], rows: list[dict[str, Any]]
) -> dict[str, float]:
    """Reward every trajectory in place with ``job``'s reward; returns the ``count/...`` metrics
    of the outcomes."""
    reward = job.config.reward
    counts = await score(
        trajectories, {row_id_of(r): r for r in rows}, job.reward_fn,
        on_error=reward.on_error, failed_rollout_reward=reward.failed_rollout_reward,
    )  # fmt: skip
    return {f"count/{k}": float(v) for k, v in counts.items()}
