"""A trainer group keeps at most ``max_replay_updates`` batches for a rebuild's replay."""

from __future__ import annotations

import pytest

from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.trainer.group import RankDiedError, TrainerError, TrainerGroup


def bookkeeping(max_replay_updates: int) -> TrainerGroup:
    """The group's replay bookkeeping alone (no workers: only `_remember`/`_recovering`)."""
    group = object.__new__(TrainerGroup)
    group.config = TrainerConfig(max_replay_updates=max_replay_updates)
    group._checkpoints, group._since_checkpoint, group._unreplayable = {}, [], set()
    group.restarts = 0
    return group


def dies() -> None:
    raise RankDiedError("rank 1 died")


def test_the_replay_log_is_bounded_and_a_death_beyond_it_ends_the_run():
    group = bookkeeping(3)
    for i in range(3):
        group._remember("a" if i % 2 else "b", f"batch-{i}")
    assert len(group._since_checkpoint) == 3
    group._remember("a", "batch-3")  # one too many: nothing kept, both adapters unreplayable
    assert group._since_checkpoint == [] and group._unreplayable == {"a", "b"}
    group._remember("b", "batch-4")
    assert group._since_checkpoint == []
    with pytest.raises(TrainerError, match="max_replay_updates=3"):
        group._recovering(dies)
    group._checkpointed("a", "/ckpt/a")
    assert group._unreplayable == {"b"}  # b's dropped updates are still missing
    group._checkpointed("b", "/ckpt/b")
    group._remember("a", "batch-5")
    assert group._unreplayable == set() and group._since_checkpoint == [("a", "batch-5")]
