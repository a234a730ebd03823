"""LLM-judge rewards: one judge call per row scores its rollouts against each other; the call
is never in a rollout's ledger, shows as a reward span on traced rollouts, and a judge that
fails makes counted reward errors."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessage

import agentrl_sdk as sdk
from agentrl_sdk import TokenChatModel
from agentrl_sdk.rollout.judge import parse_scores
from agentrl_sdk.rollout.rewards import score
from agentrl_sdk.types import RolloutEvent, Trajectory

ROWS = {"a": {"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
        "b": {"id": "b", "messages": [{"role": "user", "content": "What is 4 + 4?"}]}}


def _rollouts(answers: dict[str, list[str]], traced: bool = False) -> list[Trajectory]:
    graph = [RolloutEvent(kind="graph", name="graph", id="g", start_ns=1, end_ns=2)]
    return [
        Trajectory(row_id=row, sample_index=i, segments=[], calls=[],
                   final_state={"messages": [AIMessage(text)]}, events=list(graph) if traced else [])
        for row, texts in answers.items() for i, text in enumerate(texts)
    ]


def test_scores_are_read_from_the_first_scores_object():
    assert parse_scores('Sure. {"scores": [1, 0.25]}}} done', 2) == [1.0, 0.25]
    assert parse_scores('{"x": 1} {"scores": [-1, 3]}', 2) == [0.0, 1.0]  # clipped to [0, 1]
    for bad in ('{"scores": [1]}', '{"scores": ["1", 0]}', "no json", '{"scores": [NaN, 0]}'):
        with pytest.raises(ValueError, match="scores"):
            parse_scores(bad, 2)


async def test_one_call_per_row_scores_its_rollouts_relatively(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ['{"scores": [1, 0]}', '{"scores": [0.5, 0.5]}'])
    judge = sdk.rewards.judge(TokenChatModel(engine=engine, tokenizer=qwen_tokenizer),
                              "The answer must be the correct sum.")
    trajectories = _rollouts({"a": ["5", "7"], "b": ["8", "eight"]}, traced=True)
    counts = await score(trajectories, ROWS, judge)
    assert not counts
    prompts = [qwen_tokenizer.decode(p) for p in engine.prompts]
    assert len(prompts) == 2  # one judge call per row
    by_row = {("2 + 3" in p): p for p in prompts}
    assert "Attempt 1:\n5" in by_row[True] and "Attempt 2:\n7" in by_row[True]
    assert "correct sum" in by_row[True]
    rewards = {(t.row_id, t.sample_index): t.rewards for t in trajectories}
    scores = sorted([rewards["a", 0]["judge"], rewards["a", 1]["judge"]]), sorted(
        [rewards["b", 0]["judge"], rewards["b", 1]["judge"]])
    assert sorted(scores) == [[0.0, 1.0], [0.5, 0.5]]  # which row got which reply: arrival order
    for traj in trajectories:
        assert traj.reward == traj.rewards["judge"] and not traj.calls  # never in a ledger
        (event,) = [e for e in traj.events if e.kind == "reward"]
        assert event.outputs["score"] == traj.rewards["judge"]
        assert event.outputs["attempt"] == traj.sample_index + 1


async def test_a_judge_that_fails_makes_counted_reward_errors(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["I cannot judge this."])
    judge = sdk.rewards.judge(TokenChatModel(engine=engine, tokenizer=qwen_tokenizer), "r")
    trajectories = _rollouts({"a": ["5", "7"]}, traced=True)
    trajectories.append(Trajectory(row_id="a", sample_index=2, segments=[], calls=[],
                                   status="timeout", final_state=None))
    counts = await score(trajectories, ROWS, judge, on_error="drop")
    assert counts == {"reward_errors": 2, "rollouts_failed": 1}
    assert [t.reward for t in trajectories[:2]] == [None, None]
    assert all("judge gave no" in t.error for t in trajectories[:2])
    assert all(e.error for t in trajectories[:2] for e in t.events if e.kind == "reward")
    assert len(engine.prompts) == 1  # the failed rollout was not shown to the judge


async def test_a_judge_that_hangs_times_out(qwen_tokenizer):
    class Stuck:
        policy_version = 0

        async def generate(self, *args, **kwargs):
            await asyncio.sleep(60)

    judge = sdk.rewards.judge(TokenChatModel(engine=Stuck(), tokenizer=qwen_tokenizer), "r",
                              timeout_s=0.2)
    trajectories = _rollouts({"a": ["5"]})
    counts = await asyncio.wait_for(score(trajectories, ROWS, judge), 10)
    assert counts == {"reward_errors": 1} and "TimeoutError" in trajectories[0].error
