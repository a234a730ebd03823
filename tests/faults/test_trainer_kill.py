"""SIGKILL of a trainer rank in the middle of a run: the group is rebuilt from the last
checkpoint, the updates since are replayed, the failed update runs again, and the run
finishes with every update made exactly once."""

from __future__ import annotations

import os
import signal

import pytest

import agentrl_sdk.pipeline.update as update_module
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow


def test_a_killed_trainer_rank_is_rebuilt_and_nothing_is_lost_or_doubled(tmp_path, monkeypatch):
    killed: list[int] = []
    update = update_module.update_policy

    async def kill_rank_1_before_update_3(policy, step, samples):
        if step == 3 and not killed:
            killed.append(policy.group.ranks.pids[1])
            os.kill(killed[0], signal.SIGKILL)
        return await update(policy, step, samples)

    monkeypatch.setattr(update_module, "update_policy", kill_rank_1_before_update_3)
    config = demo_config(4)
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 2  # the rebuild loads step 2 and replays update 3's predecessor
    config.trainer = config.trainer.model_copy(update={"world_size": 2})

    result = train_demo(config)

    assert killed and result.steps == 4
    # The workers' own update count: the replay and the retry restored it exactly.
    assert [m["train/step"] for m in result.history] == [1.0, 2.0, 3.0, 4.0]
    assert [m["train/restarts"] for m in result.history] == [0.0, 0.0, 0.0, 1.0]
    assert [m["policy_version"] for m in result.history] == [1.0, 2.0, 3.0, 4.0]


def test_a_rank_killed_during_a_weight_push_is_rebuilt_and_the_push_completes(
    tmp_path, monkeypatch
):
    from agentrl_sdk.trainer.exports import WeightExports

    stage, pushes, killed = WeightExports.stage, [], []

    def kill_rank_1_then_stage(self, *args, **kwargs):
        pushes.append(len(pushes))
        if len(pushes) == 2:  # the second push: its gather meets a dead rank
            killed.append(self._ranks.pids[1])
            os.kill(killed[0], signal.SIGKILL)
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(WeightExports, "stage", kill_rank_1_then_stage)
    config = demo_config(3)
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 1
    config.trainer = config.trainer.model_copy(update={"world_size": 2})

    result = train_demo(config)

    assert killed and result.steps == 3 and len(pushes) == 3
    assert [m["train/step"] for m in result.history] == [1.0, 2.0, 3.0]
    assert [m["policy_version"] for m in result.history] == [1.0, 2.0, 3.0]
    assert result.history[-1]["train/restarts"] == 1.0
