"""LangGraph's prebuilt ReAct agent trains unchanged: its "agent" node's calls are recorded and trained."""

from __future__ import annotations

import asyncio

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import load_pretrained_pair
from agentrl_sdk.pipeline import TrainConfig
from examples.react_prebuilt.agent import build_graph
from examples.react_prebuilt.train import HERE, run
from examples.tool_selection.agent import graph_input, make_rows
from examples.tool_selection.model import model_path
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow


def test_prebuilt_agent_rollouts_are_token_exact_and_attributed():
    model, tokenizer = load_pretrained_pair(model_path(progress=False))
    engine = TorchEngine(model)
    config = RolloutConfig.model_validate({"n": 4, "sampling": {"max_tokens": 32, "seed": 1}})
    try:
        trajectories = asyncio.run(sdk.arollout_batch(
            build_graph(), make_rows(2, seed=9), engine, tokenizer=tokenizer, config=config,
            input_fn=graph_input))
    finally:
        engine.close()
    assert len(trajectories) == 8
    for t in trajectories:
        assert t.calls and all(call.node == "agent" for call in t.calls), t.error
        assert all(s.node == "agent" and s.trained for s in t.segments)
        for index, segment in enumerate(t.segments):
            sampled = [i for c in t.calls if c.segment_index == index for i in c.response_ids]
            assert segment.generated_ids == sampled  # trained tokens = what the engine sampled


def test_brief_training_run(tmp_path):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 2
    config.data.batch_size = 4
    config.checkpoint.dir = None
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # The example's Ray placement is tests/examples/test_tool_selection.py's subject.
    trainer_in_process(config)
    result = run(config)
    assert [m["policy_version"] for m in result.history] == [1, 2]
    # Each step trained, or its batch had no signal: no optimizer step, counted.
    assert all(m.get("train/trained_tokens", 0) > 0 or m["train/skipped_no_signal"] == 1
               for m in result.history)
