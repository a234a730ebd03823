"""A trainer group keeps at most ``max_replay_updates`` batches for a rebuild's replay."""

from __future__ import annotations

import pytest

from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.trainer.errors import RankDiedError, TrainerError
from agentrl_sdk.trainer.ranks import RankSet
from agentrl_sdk.trainer.replay import ReplayLog
from agentrl_sdk.trainer.worker import PolicyWorker


def bookkeeping(max_replay_updates: int) -> RankSet:
    """A group's ranks, never started: only their replay log and `recovering`."""
    config = TrainerConfig(max_replay_updates=max_replay_updates)
    return RankSet(PolicyWorker, config, (), ReplayLog(max_replay_updates))


def dies() -> None:
    raise RankDiedError("rank 1 died")


def test_the_replay_log_is_bounded_and_a_death_beyond_it_ends_the_run():
    group = bookkeeping(3)
    log = group.replay_log
    for i in range(3):
        log.remember("a" if i % 2 else "b", f"batch-{i}")
    assert len(log.updates) == 3
    log.remember("a", "batch-3")  # one too many: nothing kept, both adapters unreplayable
    assert log.updates == [] and log.unreplayable == {"a", "b"}
    log.remember("b", "batch-4")
    assert log.updates == []
    with pytest.raises(TrainerError, match="max_replay_updates=3"):
        group.recovering(dies)
    log.checkpointed("a", "/ckpt/a")
    assert log.unreplayable == {"b"}  # b's dropped updates are still missing
    log.checkpointed("b", "/ckpt/b")
    log.remember("a", "batch-5")
    assert log.unreplayable == set() and log.updates == [("a", "batch-5")]


def test_a_replay_loads_each_checkpoint_then_the_updates_since_in_order():
    log = ReplayLog(10)
    log.remember(None, "batch-0")  # before the checkpoint: not replayed
    log.checkpointed(None, "/ckpt/0")
    log.remember("b", "batch-1")
    log.remember(None, "batch-2")
    calls = []
    log.replay(lambda adapter, folder: calls.append((adapter, "load_checkpoint", folder)),
               lambda adapter, batch: calls.append((adapter, "update", batch)))
    assert calls == [(None, "load_checkpoint", "/ckpt/0"), ("b", "update", "batch-1"),
                     (None, "update", "batch-2")]  # fmt: skip


def test_without_restarts_nothing_is_kept():
    log = ReplayLog(10, enabled=False)
    log.remember(None, "batch-0")
    assert log.updates == [] and log.unreplayable == set()
