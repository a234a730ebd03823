"""`sdk.train` on a dataset with a malformed row: skipped and counted, or refused before a step."""

from __future__ import annotations

import mlflow
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.data import DatasetError
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import make_rows
from examples.tool_selection.train import HERE
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow


def _rows() -> list[dict]:
    rows = make_rows(8, seed=5)
    bad = {**rows[3], "messages": [{"role": "robot", "content": "What is 2 + 2?"}]}
    return [*rows[:3], bad, *rows[4:]]


def _config(tmp_path, on_bad_row: str) -> TrainConfig:
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 1
    config.evaluation.every = 0  # no held-out rows here
    config.data.batch_size = 4
    config.data.on_bad_row = on_bad_row
    config.rollout.n = 4
    config.checkpoint.dir = None
    config.checkpoint.export_final = False
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "off"
    trainer_in_process(config)
    return config


def test_a_malformed_row_is_skipped_and_counted(tmp_path):
    config = _config(tmp_path, "skip")
    job = resolve_entrypoints(config)

    result = sdk.train(job.graph, _rows(), reward=job.reward, config=config,
                       input_fn=job.input_fn)

    assert result.steps == 1 and result.skipped_rows == 1
    history = mlflow.MlflowClient(config.tracking.uri).get_metric_history(
        result.run_id, "data/skipped_rows")
    assert [m.value for m in history] == [1.0]


def test_on_bad_row_raise_fails_before_any_step(tmp_path):
    config = _config(tmp_path, "raise")
    job = resolve_entrypoints(config)

    with pytest.raises(DatasetError, match=r"row 3, field 'messages\.0\.role'"):
        sdk.train(job.graph, _rows(), reward=job.reward, config=config, input_fn=job.input_fn)
    assert not (tmp_path / "mlflow.db").exists()  # no run was started
