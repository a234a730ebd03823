"""Tracking never takes training down: an unreachable URI fails in seconds before any engine
starts; a tracking server that vanishes mid-run is warned about once and counted, training
finishes, and the engines and trainers stop before the run's end is even tried."""

from __future__ import annotations

import logging
import time

import mlflow
import pytest
import yaml
from typer.testing import CliRunner

import agentrl_sdk.pipeline.session as session_module
from agentrl_sdk.cli import app
from agentrl_sdk.errors import TrackingError
from agentrl_sdk.tracing import MlflowServer, TrainingRun
from agentrl_sdk.tracing.server import free_port
from examples.tool_selection.agent import right_tool_reward
from tests.pipeline._demo import train_demo
from tests.pipeline.test_fully_async import _config

pytestmark = pytest.mark.slow


def test_an_unreachable_tracking_uri_fails_in_seconds_before_any_engine(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(session_module, "start_policies", lambda *a, **k: started.append(a))
    config = _config(tmp_path, 2)
    config.tracking.enabled = True
    config.tracking.uri = uri = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(TrackingError, match=f"tracking.uri '{uri}'.*tracking server up"):
        train_demo(config)
    assert time.monotonic() - began < 15  # MLflow's own retries took ~4 minutes
    assert not started

    # `agentrl train` says the same in one line, exit code 2, no traceback.
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    cli = CliRunner().invoke(app, ["train", str(tmp_path / "job.yaml")])
    assert cli.exit_code == 2 and "Traceback" not in cli.output, cli.output
    assert cli.stderr.startswith(f"error: cannot open an MLflow run at tracking.uri '{uri}'")
    assert not started


def _wait_for_step(uri: str, experiment: str, step: int, timeout_s: float = 60.0) -> str:
    """The run id once the run has ``reward/mean`` of ``step`` in the store."""
    client = mlflow.MlflowClient(uri)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = client.get_experiment_by_name(experiment)
        for run in client.search_runs([found.experiment_id]) if found else []:
            if any(m.step == step for m in client.get_metric_history(run.info.run_id,
                                                                    "reward/mean")):
                return run.info.run_id
        time.sleep(0.5)
    raise AssertionError(f"step {step} never reached {uri}")


def test_a_vanishing_tracking_server_is_counted_and_training_finishes(
    tmp_path, monkeypatch, caplog
):
    order: list[str] = []
    stop_policies, end = session_module.stop_policies, TrainingRun.end

    async def spy_stop(policies):
        order.append("stop policies")
        await stop_policies(policies)

    def spy_end(self, *args, **kwargs):
        order.append("end run")
        end(self, *args, **kwargs)

    monkeypatch.setattr(session_module, "stop_policies", spy_stop)
    monkeypatch.setattr(TrainingRun, "end", spy_end)
    server = MlflowServer(f"sqlite:///{tmp_path / 'mlflow.db'}", log_path=tmp_path / "srv.log")
    config = _config(tmp_path, 3)
    config.tracking.enabled = True
    config.tracking.experiment = "outage"
    config.tracking.end_timeout_s = 5.0
    calls = []
    killed = []

    def reward_then_kill_server(state, row, trajectory):
        calls.append(1)
        if len(calls) > config.data.batch_size * config.rollout.n and not killed:
            # Step 2's rollouts are being scored: step 1 is in the store; now it goes away.
            killed.append(_wait_for_step(server.url, "outage", 0))
            server.stop()
        return right_tool_reward(state, row, trajectory)

    with server:
        config.tracking.uri = server.url
        with caplog.at_level(logging.WARNING, logger="agentrl_sdk.tracing"):
            result = train_demo(config, reward=reward_then_kill_server)
    assert killed and result.steps == 3 and len(result.history) == 3
    assert result.run_id == killed[0]
    assert result.history[-1]["tracking/failed_writes"] >= 1
    assert result.tracking_failed_writes >= 1 and result.tracking_dropped_writes >= 1
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Once per outage, not once per write: the metrics buffer when its first write fails...
    outage = [r.name for r in warned if "training goes on" in r.getMessage()]
    assert outage.count("agentrl_sdk.tracing.write_buffer") == 1
    # ... the trace writer when a batch fails, and at the end for the batches it had no answer
    # for (a loaded machine may end the run before the writer process hears of the outage).
    assert 1 <= sum(r.name == "agentrl_sdk.tracing.writer" for r in warned) <= 2
    assert order == ["stop policies", "end run"]
