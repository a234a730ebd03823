"""`agentrl train CONFIG` and `agentrl evaluate CONFIG` run the job the config's entrypoint names."""

from __future__ import annotations

import json

import mlflow
import pytest
from typer.testing import CliRunner

from agentrl_sdk.cli import app
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.types import Trajectory
from examples.tool_selection.agent import held_out_rows
from examples.tool_selection.train import HERE
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow


def test_train_then_evaluate_the_final_model_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's relative paths (runs/...) land here
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.data.batch_size = 2
    config.rollout.n = 4
    config.evaluation.every = 1
    config.evaluation.max_rows = 4
    trainer_in_process(config)
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    runner = CliRunner()

    trained = runner.invoke(app, ["train", str(path), "--steps", "2"])
    assert trained.exit_code == 0, trained.output
    assert "reward per step:" in trained.output
    for updates in (0, 1, 2):
        assert f"eval after {updates} updates: reward" in trained.output
    final_model = tmp_path / "runs/tool_selection/checkpoints/final_model"
    assert (final_model / "model.safetensors").exists()
    store = f"sqlite:///{tmp_path / 'runs/mlflow.db'}"
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("tool-selection-demo")
    (train_run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(train_run.info.run_id, "eval/reward/mean")
    assert sorted(h.step for h in history) == [0, 1, 2]

    out = tmp_path / "eval.jsonl"
    evaluated = runner.invoke(app, ["evaluate", str(path), "--model", str(final_model),
                                    "--output", str(out)])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert "pass_at_1" in evaluated.output and "reward/mean" in evaluated.output
    # It names the model it evaluated, not a training step it never had.
    assert "eval of" in evaluated.output and "eval after" not in evaluated.output
    trajectories = [Trajectory.model_validate(json.loads(line)) for line in
                    out.read_text().splitlines()]  # fmt: skip
    # entrypoint.eval_dataset, cut to evaluation.max_rows, one greedy sample each.
    assert [t.row_id for t in trajectories] == [r["id"] for r in held_out_rows()[:4]]
    assert all(t.calls and t.reward in (0.0, 1.0) for t in trajectories)
    # The last training evaluation saw the same weights: the same rewards.
    last = max(history, key=lambda h: h.step)
    assert last.value == pytest.approx(sum(t.reward for t in trajectories) / 4)
