"""SIGKILL of an engine actor in the middle of a step: the run finishes, the dead replica's
calls move to the other one (counted), the replica is rebuilt and serves again from the next
weight push, and no rollout is lost or trained twice. Alone, its rollouts in flight are rolled
out again on the rebuilt engine. A batch without signal takes no optimizer step."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import defaultdict

import pytest
import torch
from safetensors.torch import load_file

from agentrl_sdk.engines.ray import RayEngine
import agentrl_sdk.pipeline.update as update_module
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("replicas", [2, 1])
def test_a_killed_engine_actor_is_survived_and_replaced(monkeypatch, replicas):
    """With two replicas the killed one's calls move to the other; alone, the rows whose
    rollouts failed on it wait for the weights pushed to the rebuilt one and run again there
    (counted): either way every rollout of every step is trained once, none failed."""
    trained: dict[int, list] = defaultdict(list)
    killed: list[int] = []
    update, generate = update_module.update_policy, RayEngine.generate

    async def spy_update(policy, step, samples):
        trained[step].extend(samples)
        if step == 2:  # on a busy machine a rebuild can outlast a step: let it land first
            for _ in range(600):
                if not policy.engine.restarting:
                    break
                await asyncio.sleep(0.1)
        return await update(policy, step, samples)

    async def kill_first_replica_in_step_1(self, *args, **kwargs):
        if trained and not killed and self is engines[0]:
            killed.append(self.pid)
            os.kill(self.pid, signal.SIGKILL)  # mid-step: its rollouts' calls are in flight
        return await generate(self, *args, **kwargs)

    engines: list[RayEngine] = []
    init = RayEngine.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(update_module, "update_policy", spy_update)
    monkeypatch.setattr(RayEngine, "generate", kill_first_replica_in_step_1)
    monkeypatch.setattr(RayEngine, "__init__", record)
    config = demo_config(4, in_process=True)  # the engines on Ray, the trainer in this process
    config.engine.ray_actors = True
    config.engine.replicas = replicas

    result = train_demo(config)

    assert killed and result.steps == 4
    assert [m["policy_version"] for m in result.history] == [1.0, 2.0, 3.0, 4.0]
    last = result.history[-1]
    assert last["engine/restarts"] == 1.0
    assert last["engine/drained_replicas"] == 0.0  # the rebuilt replica rejoined
    assert len(engines) == replicas + 1
    failed = sum(m.get("status/engine_error", 0.0) for m in result.history)
    assert failed == 0 and sorted(trained) == [0, 1, 2, 3]
    for step, samples in trained.items():
        rollouts = {(s.row_id, s.sample_index) for s in samples}
        assert len(rollouts) == 2 * 4, step  # every rollout of the step trained...
        keys = [(s.row_id, s.sample_index, tuple(s.response_ids)) for s in samples]
        assert len(keys) == len(set(keys)), step  # ...once
    rows = [row for step in sorted(trained) for row in {s.row_id for s in trained[step]}]
    assert len(rows) == len(set(rows)) == 4 * 2  # no row trained twice, none lost
    if replicas == 2:
        assert last["engine/reroutes"] >= 1 and last["async/engine_retries"] == 0
    else:  # the rows in flight on it ran again, after the weights were pushed again
        assert last["async/engine_retries"] >= 1 and last["async/repushes"] >= 1


def test_a_batch_without_signal_takes_no_optimizer_step(tmp_path):
    """Every rollout scored alike (as when all failed): zero advantages, so no optimizer step,
    counted; the pushes go on and the final weights are the starting ones, bit for bit."""
    config = demo_config(2, in_process=True)
    config.checkpoint.dir = str(tmp_path / "ckpt")
    result = train_demo(config, reward=lambda state, row, trajectory: 0.0)

    assert [m["train/skipped_no_signal"] for m in result.history] == [1.0, 1.0]
    assert [m["train/optimizer_steps"] for m in result.history] == [0.0, 0.0]
    assert not any("train/loss" in m for m in result.history)
    assert [m["policy_version"] for m in result.history] == [1.0, 2.0]
    start = load_file(f"{config.model.path}/model.safetensors")
    final = load_file(f"{result.final_model}/model.safetensors")
    assert start.keys() == final.keys()
    assert all(torch.equal(start[k], final[k]) for k in start)
