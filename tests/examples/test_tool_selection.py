"""End to end: sdk.train on the tool-selection agent raises its reward and moves its weights."""

from __future__ import annotations

import mlflow
import pytest
from safetensors.torch import load_file

from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.train import HERE, run

pytestmark = pytest.mark.slow


def test_training_raises_reward_and_updates_the_policy(tmp_path):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 24
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 12
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = run(config)

    curve = [m["reward/mean"] for m in result.history]
    assert len(curve) == 24
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.08, curve
    # The held-out questions were evaluated (greedy) before training, every 10 updates and
    # at the end, on the weights of that update.
    assert [e.step for e in result.evaluations] == [0, 10, 20, 24]
    assert all(e.metrics["rows"] == 32 for e in result.evaluations)
    # Every step synced new weights to the engine, recorded as the policy version.
    assert [m["policy_version"] for m in result.history] == list(range(1, 25))
    # The trained policy differs from the warm start it began from.
    before = load_file(f"{config.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    moved = [k for k in before if not (before[k] == after[k]).all()]
    assert len(moved) > len(before) // 2
    # Checkpoints every 12 steps, and the MLflow run holds the curve.
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_12", "step_24"]
    history = mlflow.MlflowClient(config.tracking.uri).get_metric_history(result.run_id, "reward/mean")
    assert [round(m.value, 6) for m in sorted(history, key=lambda m: m.step)] == [
        round(r, 6) for r in curve
    ]
