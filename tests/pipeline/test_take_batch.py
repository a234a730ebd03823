"""The fully-async trainer's batches: a row's second group (the row again in the next epoch)
waits for the next batch instead of joining the first's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.loop import _Trainer
from agentrl_sdk.pipeline.trajectory_queue import FinishedGroup, GroupQueue


def _group(index: int, row: str) -> FinishedGroup:
    return FinishedGroup(index=index, row={"id": row}, trajectories=[], admitted_step=0,
                         oldest_step=0)  # fmt: skip


def test_a_rows_second_group_waits_for_the_next_batch():
    async def batches() -> list[list[int]]:
        queue = GroupQueue(8)
        # Row "a" ends epoch 0 and starts epoch 1 (24 rows an epoch): both groups finish
        # together. In one batch, their samples collided as one group's, and building the
        # batch failed: "group_ids has 8 entries but rewards has 12".
        for index, row in [(22, "b"), (23, "a"), (24, "a"), (25, "c"), (26, "d"), (27, "e")]:
            await queue.put(_group(index, row))
        rollouter = SimpleNamespace(failure=None, engines_failed=asyncio.Event())
        schedule = SimpleNamespace(batch_size=3, flat_budget=0, max_staleness=1,
                                   is_stale=lambda _: False)
        job = SimpleNamespace(trained=[], config=TrainConfig())
        trainer = _Trainer(job, queue, rollouter, schedule)
        stop = asyncio.Event()
        taken = []
        for step in (0, 1):
            groups, flat = await trainer._take_batch(step, stop)
            taken.append([g.index for g, _ in groups + flat])
        return taken

    assert asyncio.run(batches()) == [[22, 23, 25], [24, 26, 27]]
