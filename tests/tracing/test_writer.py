"""The trace writer process: writes batches in order, counts what the store refuses, loses
nothing silently when it dies or is closed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import mlflow

from agentrl_sdk.tracing import TraceWriter, TrainingRun, build_trace_payload
from agentrl_sdk.types import Trajectory


def _trajectories(n: int, row: str = "r") -> list[Trajectory]:
    return [Trajectory(row_id=row, sample_index=i, status="ok", reward=float(i)) for i in range(n)]


def test_background_traces_are_written_by_the_writer_process(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = TrainingRun(uri, "writer-test")
    ids = run.log_traces(0, _trajectories(3), background=True)
    ids += run.log_traces(1, _trajectories(2, "s"), background=True)
    assert run.flush(timeout=120) == 0
    found = mlflow.MlflowClient(uri).search_traces(locations=[run.experiment_id], max_results=10)
    assert sorted(t.info.trace_id for t in found) == sorted(ids)
    assert {t.info.tags["step"] for t in found} == {"0", "1"}
    assert run._writer.written == 5 and run.traces_lost == 0
    run.end()
    assert run._writer._process is None


def test_refused_batches_are_counted_and_later_batches_still_written(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = mlflow.MlflowClient(uri).create_experiment("ok")
    writer = TraceWriter(uri, experiment)
    bad = [build_trace_payload(t, experiment_id="999", step=0) for t in _trajectories(2)]
    good = [build_trace_payload(t, experiment_id=experiment, step=0) for t in _trajectories(1)]
    writer.submit(bad)
    writer.submit(good)
    assert writer.flush(timeout=120)
    assert (writer.errors, writer.lost, writer.written) == (1, 2, 1)
    writer.close(timeout=10)


def test_a_dead_writer_reports_its_traces_lost_and_a_new_one_takes_over(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = mlflow.MlflowClient(uri).create_experiment("ok")
    writer = TraceWriter(uri, experiment)
    payloads = [build_trace_payload(t, experiment_id=experiment, step=0) for t in _trajectories(2)]
    writer.submit(payloads)
    assert writer.flush(timeout=120)
    os.kill(writer._process.pid, signal.SIGKILL)
    writer._process.wait(timeout=10)
    again = build_trace_payload(_trajectories(1, "s")[0], experiment_id=experiment, step=1)
    writer.submit([again])  # a new process: this batch is written
    assert writer.flush(timeout=120)
    assert (writer.written, writer.errors, writer.lost) == (3, 0, 0)
    os.kill(writer._process.pid, signal.SIGKILL)
    writer._pending[99] = 4  # a batch the dead process never answered
    writer.flush(timeout=10)
    assert (writer.errors, writer.lost) == (1, 4)
    writer.close(timeout=1)


def test_the_writer_process_holds_mlflow_but_not_torch_or_the_package(tmp_path):
    """The child imports MLflow alone: no libtorch mapped into it (~0.3 GB less per run)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = mlflow.MlflowClient(uri).create_experiment("ok")
    writer = TraceWriter(uri, experiment)
    writer.submit([build_trace_payload(_trajectories(1)[0], experiment_id=experiment, step=0)])
    assert writer.flush(timeout=120) and writer.written == 1
    maps = Path(f"/proc/{writer._process.pid}/maps").read_text()
    writer.close(timeout=10)
    assert "mlflow" in maps or "sqlalchemy" in maps  # the store was really used in there
    assert "libtorch" not in maps


def test_close_with_nothing_written_starts_no_process(tmp_path):
    writer = TraceWriter(f"sqlite:///{tmp_path / 'mlflow.db'}", "0")
    writer.submit([])
    writer.close(timeout=1)
    assert writer._process is None and writer.pending == 0


def test_a_config_key_mlflow_refuses_costs_no_param_and_the_exact_config_is_kept(tmp_path):
    """A node pattern's ``*`` in a config key: MLflow refuses such a name, and with it the whole
    batch of params it came in; the key is made safe and the config kept whole as JSON."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = TrainingRun(uri, "params")
    config = {"rollout": {"n": 4, "nodes": {"math_worker/*": {"trained": True}}}}
    run.log_config(config)
    run.end()
    client = mlflow.MlflowClient(uri)
    logged = client.get_run(run.run_id)
    assert logged.data.params == {"rollout.n": "4", "rollout.nodes.math_worker/_.trained": "True"}
    assert mlflow.artifacts.load_dict(f"{logged.info.artifact_uri}/config.json") == config
    assert run.health()["tracking/dropped_writes"] == 0.0
