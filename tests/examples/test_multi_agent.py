"""Supervisor + two workers: two trained policies and one frozen one in a single graph."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.tracing import load_trace_view, search_rollout_traces
from examples.multi_agent.train import HERE, run

pytestmark = pytest.mark.slow


def test_brief_run_trains_two_policies_and_keeps_the_frozen_one(tmp_path):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 2
    config.data.batch_size = 4
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 0
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "all"

    result = run(config)

    for step, metrics in enumerate(result.history, start=1):
        # Each trained policy got its own update and weight sync; the frozen one none.
        assert metrics["policy_version"] == step and metrics["policy_version/supervisor"] == step
        assert metrics["train/supervisor/trained_tokens"] > 0
        assert not any(key.startswith(("train/words", "policy_version/words")) for key in metrics)
        assert "reward/routing" in metrics  # the supervisor's per-node reward
    # Both trained policies were exported; the default one moved off its warm start.
    assert set(result.final_models) == {"supervisor"}
    before = load_file(f"{config.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)
    assert (tmp_path / "ckpt" / "policies" / "supervisor" / "step_2").is_dir()
    # The frozen worker ran: some rollout holds its segments, recorded as not trained.
    infos = search_rollout_traces(config.tracking.uri, run_id=result.run_id, limit=100)
    assert len(infos) == 64  # 2 steps x 4 rows x 8 samples
    segments = [s for i in infos for s in load_trace_view(config.tracking.uri, i.trace_id).segments]
    frozen = [s for s in segments if s["policy"] == "words"]
    assert frozen and all(not s["trained"] and s["node"] == "words_worker" for s in frozen)
    assert all(s["trained"] for s in segments if s["policy"] != "words")
