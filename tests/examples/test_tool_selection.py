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
    # 14 updates, not the demo's 40: the first and last 6 steps are then disjoint and, with
    # the fixed seed (the same curve run after run), 0.177 -> 0.292: a margin of 0.035 over
    # the bound. Each step costs ~10 s contended.
    config.max_steps = 14
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 7
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = run(config)

    curve = [m["reward/mean"] for m in result.history]
    assert len(curve) == 14
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.08, curve
    # The held-out questions were evaluated (greedy) before training, every 10 updates and
    # at the end, on the weights of that update.
    assert [e.step for e in result.evaluations] == [0, 10, 14]
    assert all(e.metrics["rows"] == 32 for e in result.evaluations)
    # Every step synced new weights to the engine, recorded as the policy version.
    assert [m["policy_version"] for m in result.history] == list(range(1, 15))
    # The trained policy differs from the warm start it began from.
    before = load_file(f"{config.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    moved = [k for k in before if not (before[k] == after[k]).all()]
    assert len(moved) > len(before) // 2
    # Checkpoints every 7 steps, and the MLflow run holds the curve.
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_14", "step_7"]
    history = mlflow.MlflowClient(config.tracking.uri).get_metric_history(result.run_id, "reward/mean")
    assert [round(m.value, 6) for m in sorted(history, key=lambda m: m.step)] == [
        round(r, 6) for r in curve
    ]
