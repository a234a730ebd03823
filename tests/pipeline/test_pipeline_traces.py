"""The sync pipeline traces every rollout of a step, with credit, and logs checkpoints to its run."""

from __future__ import annotations

import math

import mlflow
import pytest

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.tracing import load_trace_view, search_rollout_traces
from examples.tool_selection.train import HERE, run
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow


def test_training_run_holds_traces_checkpoints_and_versions(tmp_path):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 2
    config.data.batch_size = 2
    config.rollout.n = 4
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 1
    config.checkpoint.keep_last = 1
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "all"
    trainer_in_process(config)

    result = run(config)

    uri, run_id = config.tracking.uri, result.run_id
    client = mlflow.MlflowClient(uri)
    for step in (0, 1):
        infos = search_rollout_traces(uri, run_id=run_id, step=step, phase="train")
        assert len(infos) == 8  # 2 rows x 4 samples
        views = [load_trace_view(uri, i.trace_id) for i in infos]
        by_row: dict[str, list[float]] = {}
        for view in views:
            root = view.root
            assert view.tags["status"] == root["status"] and view.tags["run_id"] == run_id
            assert float(view.tags["reward"]) == root["reward"]
            assert root["policy_versions"] == [step]  # sampled by the weights of that step
            if root["advantage"] is not None:
                by_row.setdefault(root["row_id"], []).append(root["advantage"])
            assert sum(line.kind == "CHAT_MODEL" for line in view.spans) == len(
                [s for s in view.spans if s.kind == "LLM"])
        # GRPO advantages are centred within each row's group; loss shares add up to 1.
        assert all(math.isclose(sum(a), 0.0, abs_tol=1e-6) for a in by_row.values())
        shares = [v.root["loss_share"] or 0.0 for v in views]
        assert math.isclose(sum(shares), 1.0, rel_tol=1e-6) or sum(shares) == 0.0
    history = client.get_metric_history(run_id, "traces/logged")
    assert [m.value for m in history] == [8.0, 8.0]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"checkpoints", "final_model", "package_versions.json", "config.json"} <= artifacts
    assert {a.path for a in client.list_artifacts(run_id, "checkpoints")} == {
        "checkpoints/step_1", "checkpoints/step_2"}
    # keep_last 1: on disk only the newest checkpoint stays (its MLflow copies all do).
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_2"]
    logged = client.get_run(run_id).data
    assert logged.tags["version.mlflow"] == mlflow.__version__
    # The config is logged as flattened params, values as the run used them.
    assert logged.params["rollout.n"] == str(config.rollout.n) == "4"
    assert logged.params["algorithm.clip_high"] == str(config.algorithm.clip_high)
