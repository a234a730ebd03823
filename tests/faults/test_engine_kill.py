"""SIGKILL of an engine actor in the middle of a step: the run finishes, the dead replica's
calls move to the other one (counted), the replica is rebuilt and serves again from the next
weight push, and no rollout is lost or trained twice."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import defaultdict

import pytest

import agentrl_sdk.pipeline.job as job_module
from agentrl_sdk.engines.ray_engine import RayEngine
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("replicas", [2, 1])
def test_a_killed_engine_actor_is_survived_and_replaced(monkeypatch, replicas):
    """With two replicas the killed one's calls move to the other; alone, its rollouts in
    flight end as engine_error (counted, not trained) until the rebuilt one serves."""
    trained: dict[int, list] = defaultdict(list)
    killed: list[int] = []
    update, generate = job_module.update_policy, RayEngine.generate

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

    monkeypatch.setattr(job_module, "update_policy", spy_update)
    monkeypatch.setattr(RayEngine, "generate", kill_first_replica_in_step_1)
    monkeypatch.setattr(RayEngine, "__init__", record)
    config = demo_config(4)
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
    for step, samples in trained.items():
        rollouts = {(s.row_id, s.sample_index) for s in samples}
        if replicas == 2:
            assert len(rollouts) == 2 * 4, step  # every rollout of the step trained...
        keys = [(s.row_id, s.sample_index, tuple(s.response_ids)) for s in samples]
        assert len(keys) == len(set(keys)), step  # ...once
    if replicas == 2:
        assert last["engine/reroutes"] >= 1 and failed == 0
    else:
        assert failed >= 1  # the lone replica's rollouts in flight, counted
        assert len({(s.row_id, s.sample_index) for s in trained[3]}) == 2 * 4  # served again
