"""Ctrl-C: the first one stops a sync or fully-async run within seconds with a complete
checkpoint that a resume continues (every finished group trained once, the interrupted ones
rolled out again); a second one stops the driver at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

import agentrl_sdk.pipeline.rollouter as rollouter_module
from agentrl_sdk.pipeline.checkpoints import MANIFEST, PIPELINE_STATE
from agentrl_sdk.pipeline.trajectory_queue import GroupQueue
from tests.faults import _driver
from tests.pipeline._demo import train_demo
from tests.pipeline.test_fully_async import _config

pytestmark = pytest.mark.slow

STOP_WITHIN_S = 10.0


def _checkpointed(tmp_path, config):
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.export_final = False
    return config


def _ctrl_c_later(sent: list[float], delay_s: float) -> None:
    """Send this process a SIGINT ``delay_s`` from now; ``sent`` gets the time it went."""

    def send() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    asyncio.get_running_loop().call_later(delay_s, send)


def _resume(config, steps: int):
    resumed = config.model_copy(update={"max_steps": steps}, deep=True)
    resumed.checkpoint.resume = True
    return train_demo(resumed)


def test_ctrl_c_during_sync_rollouts_stops_fast_and_resume_redoes_that_step(
    tmp_path, monkeypatch, trained
):
    config = _checkpointed(tmp_path, _config(tmp_path, 50))
    config.prefetch_rollouts = False  # a step's rollouts run on their own: Ctrl-C lands there
    batches, sent = [], []
    rollout_batch = rollouter_module.arollout_batch

    async def ctrl_c_during_step_2(graph, rows, *args, **kwargs):
        batches.append(sorted(r["id"] for r in rows))
        if len(batches) == 2:
            _ctrl_c_later(sent, 0.05)  # while they run, on any machine
        return await rollout_batch(graph, rows, *args, **kwargs)

    monkeypatch.setattr(rollouter_module, "arollout_batch", ctrl_c_during_step_2)
    result = train_demo(config)
    stopped_s = time.monotonic() - sent[0]
    print(f"stopped {stopped_s:.1f}s after Ctrl-C")
    assert stopped_s < STOP_WITHIN_S, stopped_s
    assert result.stopped and result.steps == 1
    assert result.checkpoint == str(tmp_path / "ckpt" / "step_1")
    assert (tmp_path / "ckpt" / "step_1" / MANIFEST).exists()
    before = {step: sorted({s.row_id for s in samples}) for step, samples in trained.items()}
    trained.clear()

    monkeypatch.setattr(rollouter_module, "arollout_batch", rollout_batch)
    resumed = _resume(config, 3)
    assert resumed.steps == 3 and len(resumed.history) == 2
    after = {step: sorted({s.row_id for s in samples}) for step, samples in trained.items()}
    assert list(before) == [0] and list(after) == [1, 2]
    assert after[1] == batches[1]  # the interrupted step's rows, rolled out again


def test_ctrl_c_during_fully_async_stops_fast_and_resume_trains_every_group_once(
    tmp_path, monkeypatch, trained
):
    config = _checkpointed(tmp_path, _config(tmp_path, 50, max_staleness=1))
    sent: list[float] = []
    taken = []
    get = GroupQueue.get

    async def ctrl_c_while_taking_step_2(queue):
        group = await get(queue)
        taken.append(group.index)
        if len(taken) == config.data.batch_size + 1:  # the first group of step 2's batch
            _ctrl_c_later(sent, 0.1)
        return group

    monkeypatch.setattr(GroupQueue, "get", ctrl_c_while_taking_step_2)
    result = train_demo(config)
    stopped_s = time.monotonic() - sent[0]
    print(f"stopped {stopped_s:.1f}s after Ctrl-C")
    assert stopped_s < STOP_WITHIN_S, stopped_s
    assert result.stopped and result.steps in (1, 2)
    folder = tmp_path / "ckpt" / f"step_{result.steps}"
    assert result.checkpoint == str(folder) and (folder / MANIFEST).exists()
    state = json.loads((folder / PIPELINE_STATE).read_text())
    queued = {g["row"]["id"] for g in state["queued"]}
    before = sorted({s.row_id for samples in trained.values() for s in samples})
    trained.clear()

    monkeypatch.setattr(GroupQueue, "get", get)
    resumed = _resume(config, result.steps + 2)
    after = sorted({s.row_id for samples in trained.values() for s in samples})
    assert len(before) + len(after) == resumed.steps * config.data.batch_size
    assert not set(before) & set(after)  # nothing trained twice
    assert queued <= set(after)  # the groups finished before Ctrl-C were trained after it


def test_a_second_ctrl_c_stops_the_driver_at_once(tmp_path):
    config = _checkpointed(tmp_path, _config(tmp_path, 50))
    driver = _driver.start(tmp_path, config)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "trained.jsonl").exists():  # training is under way
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        second = time.monotonic()
        driver.wait(timeout=60)
        print(f"exited {time.monotonic() - second:.1f}s after the second Ctrl-C")
        assert time.monotonic() - second < STOP_WITHIN_S
        assert driver.returncode != 0  # KeyboardInterrupt, not a finished run
    finally:
        _driver.stop(driver)
