"""A driver SIGKILLed while writing a fully-async checkpoint: the cut-short checkpoint is
skipped, the resume continues the same MLflow run (every step logged once, the run FINISHED)
and trains every group exactly once; a checkpoint whose parts disagree is refused; a job that
starts over instead ends the run the killed driver left RUNNING; the Ray processes the killed
driver left running are stopped by the next start."""

from __future__ import annotations

import json
import signal
import time

import mlflow
import pytest

import agentrl_sdk.pipeline.session as session_module
from agentrl_sdk.errors import CheckpointError
from agentrl_sdk.pipeline.checkpoints import (
    MANIFEST,
    PIPELINE_STATE,
    RUN_FILE,
    CheckpointManifest,
    _latest_complete,
)
from agentrl_sdk.tracing import TrainingRun
from tests.faults import _driver
from tests.pipeline._demo import train_demo, trainer_in_process
from tests.pipeline.test_fully_async import _config

pytestmark = pytest.mark.slow

STEPS, KILL_STEP = 4, 3


def _job(tmp_path):
    config = _config(tmp_path, STEPS, max_staleness=1)
    # A Ray trainer: what a killed driver leaves behind (its Ray session) is what is checked.
    config.trainer = config.trainer.model_copy(update={"placement": "ray"})
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 1
    config.checkpoint.export_final = False
    config.tracking.enabled = True
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.experiment = "driver-kill"
    config.tracking.traces = "off"
    return config


def test_a_driver_killed_mid_checkpoint_resumes_its_run_and_loses_no_group(tmp_path, trained):
    config = _job(tmp_path)
    driver = _driver.start(tmp_path, config, kill_step=KILL_STEP)
    try:
        assert driver.wait(timeout=600) == -signal.SIGKILL
        time.sleep(10)  # Ray's workers notice their raylet is gone; its agents never do
        assert _driver.leftovers(driver)
        _resume_and_check(tmp_path, config, trained)
        assert _driver.leftovers(driver) == []  # the resumed job stopped them
    finally:
        _driver.stop(driver)


def _resume_and_check(tmp_path, config, trained):
    killed = _driver.trained_rows(tmp_path)
    folder = tmp_path / "ckpt" / f"step_{KILL_STEP}"
    assert (folder / "trainer_state.json").exists() and not (folder / MANIFEST).exists()
    good = tmp_path / "ckpt" / f"step_{KILL_STEP - 1}"
    state = json.loads((good / PIPELINE_STATE).read_text())
    held = {g["row"]["id"] for g in state["queued"]} | {p["row"]["id"] for p in state["pending"]}
    assert held  # what the queue held at the checkpoint must not be lost
    client = mlflow.MlflowClient(config.tracking.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("driver-kill").experiment_id])
    assert run.info.status == "RUNNING"  # killed: nobody ended it

    resumed = config.model_copy(deep=True)
    resumed.checkpoint.resume = True
    result = train_demo(resumed)

    assert result.run_id == run.info.run_id and len(result.history) == STEPS - (KILL_STEP - 1)
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")]
    assert sorted(steps) == list(range(STEPS))  # every step logged once, in the one run
    assert client.get_run(run.info.run_id).data.tags["resumed_from"] == str(good)
    before = [r for step, rows in killed.items() if step < KILL_STEP - 1 for r in rows]
    after = [r for step in sorted(trained) for r in sorted({s.row_id for s in trained[step]})]
    assert min(trained) == KILL_STEP - 1
    assert len(before) + len(after) == STEPS * config.data.batch_size
    assert len(set(before + after)) == len(before) + len(after)  # nothing trained twice
    queued = {g["row"]["id"] for g in state["queued"]}
    assert queued <= set(after)  # the groups the queue held were trained after the resume

    # Resumed again (its driver killed after the last checkpoint), the finished run has
    # nothing left to do or save. Before: steps 0, and its weights saved again as step_0. (Its
    # trainer in this process: a Ray trainer's checkpoint resumes wherever the trainer runs.)
    done = train_demo(trainer_in_process(resumed.model_copy(deep=True)))
    last = tmp_path / "ckpt" / f"step_{STEPS}"
    assert (done.steps, done.history, done.checkpoint) == (STEPS, [], str(last))
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == [
        f"step_{s}" for s in range(1, STEPS + 1)]  # fmt: skip

    # A checkpoint whose parts disagree (its pipeline state gone) is refused, not half-resumed.
    (last / PIPELINE_STATE).unlink()
    again = resumed.model_copy(update={"max_steps": STEPS + 1})
    with pytest.raises(CheckpointError, match=f"{last} lacks {PIPELINE_STATE}"):
        train_demo(again)


def test_starting_over_ends_the_run_a_killed_driver_left_running(tmp_path):
    config = _job(tmp_path)
    left = TrainingRun(config.tracking.uri, "driver-kill")  # its driver died: still RUNNING
    (tmp_path / "ckpt" / "step_2").mkdir(parents=True)
    manifest = CheckpointManifest(step=2, policies=["default"], run_id=left.run_id)
    (tmp_path / "ckpt" / "step_2" / MANIFEST).write_text(manifest.model_dump_json())

    run = session_module.open_run(config)  # checkpoint.resume is off: a new run
    run.end()
    client = mlflow.MlflowClient(config.tracking.uri)
    assert run.run_id != left.run_id
    assert client.get_run(left.run_id).info.status == "KILLED"
    assert client.get_run(run.run_id).info.status == "FINISHED"

    # Resuming from a folder of cut-short saves only, which no job of this version started
    # (its RUN_FILE missing: an older version's checkpoints), is refused before anything starts.
    (tmp_path / "ckpt" / "step_2" / MANIFEST).unlink()
    (tmp_path / "ckpt" / RUN_FILE).unlink()
    config.checkpoint.resume = True
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        session_module.open_run(config)


def test_a_driver_killed_before_its_first_checkpoint_resumes_its_run_from_step_0(tmp_path):
    config = _job(tmp_path)
    config.checkpoint.resume = True
    first = session_module.open_run(config)  # nothing to resume: a new run, noted in RUN_FILE
    first.log_metrics(0, {"reward/mean": 0.5})
    first.flush()
    (tmp_path / "ckpt" / "step_1").mkdir()  # killed while writing its first checkpoint
    (tmp_path / "ckpt" / "step_1" / "trainer_state.json").write_text("{}")

    again = session_module.open_run(config)  # before: CheckpointError "no complete checkpoint"
    again.log_metrics(0, {"reward/mean": 0.25})  # step 0 redone: logged once all the same
    again.log_metrics(1, {"reward/mean": 0.75})
    again.end()
    client = mlflow.MlflowClient(config.tracking.uri)
    assert again.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "FINISHED"
    history = client.get_metric_history(first.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [0, 1]
    assert _latest_complete(tmp_path / "ckpt", warn=lambda _: None) is None  # start at step 0
