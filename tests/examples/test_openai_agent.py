"""examples/openai_agent: its training entry point runs a brief job through the gateway."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

import agentrl_sdk as sdk
from examples.calculator.agent import make_rows
from examples.openai_agent.agent import agent, reward
from examples.openai_agent.train import config
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow


def test_brief_training_run(tmp_path):
    settings = config(steps=2)
    settings.checkpoint.dir = str(tmp_path / "checkpoints")
    # The example's Ray placement is tests/examples/test_tool_selection.py's subject.
    trainer_in_process(settings)
    result = sdk.train(agent, make_rows(8, seed=5), reward, settings)

    assert result.steps == 2
    for step, metrics in enumerate(result.history):
        assert metrics["rollouts"] == 16  # 4 questions x 4 samples, each through the gateway
        assert metrics["llm_calls/mean"] >= 1
        # It trained, or its batch had no signal (all rewards alike): no optimizer step, counted.
        assert metrics.get("train/trained_tokens", 0) > 0 or metrics["train/skipped_no_signal"] == 1
        assert metrics["policy_version"] == step + 1
        assert 0.0 <= metrics["reward/mean"] <= 1.0
    before = load_file(f"{settings.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    updated = any(m["train/skipped_no_signal"] == 0 for m in result.history)
    assert updated == any(not (before[k] == after[k]).all() for k in before)
