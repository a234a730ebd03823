"""Real MLflow stores holding traced rollouts of the calculator agent (the real Qwen tokenizer;
scripted replies, for these unit tests of reading traces), with the engine's own record of every
prompt it saw and id it sampled."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
from agentrl_sdk.tracing import TrainingRun  # noqa: E402
from agentrl_sdk.types import Trajectory  # noqa: E402
from examples.calculator.agent import build_graph, make_rows  # noqa: E402
from tests.conftest import ScriptedEngine  # noqa: E402

TOOL_CALL = ('<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}'
             "\n</tool_call>")


@dataclass
class Served:
    """Traced rollouts in a store: the trajectories, their trace ids, the engine's record."""

    uri: str
    experiment: str
    trajectories: list[Trajectory]
    trace_ids: list[str]
    engine: object
    rows: list[dict]
    written_after_ms: int


def ensure_experiment(uri: str, name: str) -> str:
    """The id of experiment ``name``, created with its artifacts beside the sqlite file (not
    in ``./mlruns`` of the working directory)."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    folder = Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / name
    return client.create_experiment(name, artifact_location=folder.as_uri())


def serve(engine_type, tokenizer, uri: str, experiment: str, rows: list[dict], *,
          version: int = 0, tags: dict[str, str] | None = None) -> Served:
    """Roll the calculator agent out once per row (a tool call, then the answer), then trace
    every rollout into ``experiment`` as a training run does."""
    after_ms = int(time.time() * 1000)
    replies = []
    for row in rows:
        a, b, c = row["operands"]
        replies += [TOOL_CALL.format(expr=f"({a}+{b})*{c}"), f"The answer is {row['answer']}."]
    ensure_experiment(uri, experiment)
    engine = engine_type(tokenizer, replies)
    engine.policy_version = version
    trajectories = []
    for row in rows:  # one at a time: the engine's prompts stay in rollout order
        trajectories += asyncio.run(sdk.arollout(build_graph(), row, engine, tokenizer=tokenizer,
                                                 record_events=True))
    for traj in trajectories:
        traj.reward = 1.0
    run = TrainingRun(uri, experiment)
    try:
        ids = run.log_traces(0, trajectories, tokenizer=tokenizer)
    finally:
        run.end()
    if tags:
        client = mlflow.MlflowClient(uri)
        for trace_id in ids:
            for key, value in tags.items():
                client.set_trace_tag(trace_id, key, value)
    return Served(uri, experiment, trajectories, ids, engine, rows, after_ms)


@pytest.fixture(autouse=True)
def _fluent_mlflow_restored(monkeypatch):
    """Tests that write traces as another tool would (MLflow's fluent API) set the process-wide
    tracking URI and experiment: both are put back after each test."""
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.setattr(fluent, "_active_experiment_id", fluent._active_experiment_id)
    env = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if env is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = env


@pytest.fixture(scope="session")
def _empty_db(tmp_path_factory):
    """An empty, migrated sqlite store, made once (MLflow's migrations take seconds)."""
    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(_empty_db, tmp_path):
    """A fresh sqlite MLflow store (a copy of the empty one)."""
    path = tmp_path / "mlflow.db"
    shutil.copy(_empty_db, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def _served_db(_empty_db, tmp_path_factory, qwen_tokenizer):
    path = tmp_path_factory.mktemp("served") / "mlflow.db"
    shutil.copy(_empty_db, path)
    return serve(ScriptedEngine, qwen_tokenizer, f"sqlite:///{path}", "served",
                 make_rows(4, seed=3), version=7), path


@pytest.fixture
def served(_served_db, tmp_path):
    """Four traced rollouts of the calculator agent in experiment ``served``, in a store of
    the test's own (a copy: feedback logged by one test is not seen by another)."""
    template, source = _served_db
    path = tmp_path / "served.db"
    shutil.copy(source, path)
    return dataclasses.replace(template, uri=f"sqlite:///{path}")
