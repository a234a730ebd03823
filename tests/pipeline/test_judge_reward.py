"""An LLM judge served by our own engine (SmolLM2, frozen) scores a real evaluation: one call
per row, traced under each rollout, never trained on; what it cannot score is counted."""

from __future__ import annotations

import pytest

import agentrl_sdk as sdk
from agentrl_sdk import TokenChatModel
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import load_pretrained_pair
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import build_graph, graph_input, make_rows
from examples.tool_selection.model import model_path
from examples.tool_selection.train import HERE

pytestmark = pytest.mark.slow


def test_a_frozen_local_judge_scores_an_evaluation(tmp_path, smollm2_folder):
    model, tokenizer = load_pretrained_pair(smollm2_folder)
    judge_engine = TorchEngine(model)
    seen: list[list[int]] = []
    generate = judge_engine.generate

    async def counted(prompt_ids, *args, **kwargs):
        seen.append(list(prompt_ids))
        return await generate(prompt_ids, *args, **kwargs)

    judge_engine.generate = counted  # type: ignore[method-assign]
    judge = sdk.rewards.judge(
        TokenChatModel(engine=judge_engine, tokenizer=tokenizer, temperature=0.0,
                       max_tokens=24),
        "The attempt calls the arithmetic tool the question asks for.")
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.model.path = str(model_path(progress=False))
    config.evaluation = config.evaluation.model_copy(update={"n": 2})
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "all"
    rows = make_rows(3, seed=5)
    try:
        result = sdk.evaluate(build_graph(), rows, judge, config, input_fn=graph_input)
    finally:
        judge_engine.close()

    finished = [t for t in result.trajectories if t.status == "ok"]
    assert len(seen) == len({t.row_id for t in finished}) == 3  # one judge call per row
    assert all("Attempt 2:" in tokenizer.decode(p) for p in seen)
    for traj in finished:
        assert all(c.node != "judge" for c in traj.calls)  # the judge is in no rollout's ledger
        if "judge" in traj.rewards:
            assert 0.0 <= traj.rewards["judge"] <= 1.0
        else:  # a reply without usable scores: a counted reward error, not a crash
            assert "judge gave no" in traj.error
    scored = sum("judge" in t.rewards for t in finished)
    assert result.metrics.get("count/reward_errors", 0.0) == len(finished) - scored
