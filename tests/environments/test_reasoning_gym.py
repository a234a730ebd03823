"""reasoning-gym tasks as rows, reward and graph: the same rows and scores as reasoning-gym
itself gives, held-out rows never trained on, answers extracted as configured, a raising
verifier counted, and the graphs run."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage

import agentrl_sdk as sdk
from agentrl_sdk.environments.answers import last_answer_tag, last_line
from agentrl_sdk.environments.calculator import calculate, calculator
from agentrl_sdk.environments.reasoning_gym import (
    ROW_KEY,
    VerifierError,
    reasoning_gym,
    task_names,
)
from agentrl_sdk.rollout.rewards import score
from agentrl_sdk.types import Trajectory

rg = pytest.importorskip("reasoning_gym")

TASKS = ["basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "number_sorting",
         "word_sorting"]


def _reply(text: str) -> dict:
    return {"messages": [HumanMessage("q"), AIMessage(text)]}


def _entries(rows: list[dict]) -> list[dict]:
    return [r[ROW_KEY]["entry"] for r in rows]


@pytest.mark.parametrize("task", TASKS)
def test_rows_are_reasoning_gyms_own_for_the_same_seeds(task):
    env = reasoning_gym(task, size=40, seed=5, eval_size=16, eval_seed=100)
    held_out = {e["question"] for e in rg.create_dataset(task, size=16, seed=100)}
    own = [e for e in rg.create_dataset(task, size=40, seed=5) if e["question"] not in held_out]
    assert [(e["question"], e["answer"]) for e in _entries(env.rows)] == [
        (e["question"], e["answer"]) for e in own]
    assert [e["question"] for e in _entries(env.eval_rows)] == [
        e["question"] for e in rg.create_dataset(task, size=16, seed=100)]
    assert env.dropped == 40 - len(env.rows)
    row = env.rows[0]
    assert row["messages"][-1] == {"role": "user", "content": own[0]["question"]}
    assert row["messages"][0]["role"] == "system" and "<answer>" in row["messages"][0]["content"]
    assert row["data_source"] == f"reasoning_gym/{task}"
    assert row["reward_model"]["ground_truth"] == own[0]["answer"]
    assert _entries(env.rows) == own  # the whole entry, metadata included, for the verifier


def test_generator_options_reach_reasoning_gym():
    config = {"min_terms": 4, "max_terms": 4, "min_digits": 2, "max_digits": 2}
    env = reasoning_gym("chain_sum", size=10, seed=1, eval_size=0, config=config)
    own = rg.create_dataset("chain_sum", size=10, seed=1, **config)
    assert [e["question"] for e in _entries(env.rows)] == [e["question"] for e in own]
    assert all(e["metadata"]["num_terms"] == 4 for e in _entries(env.rows))


@pytest.mark.parametrize("task", TASKS)
def test_reward_is_the_tasks_own_score_answer_as_a_named_component(task):
    env = reasoning_gym(task, size=4, seed=5, eval_size=8, eval_seed=20)
    own = rg.create_dataset(task, size=8, seed=20)
    for row, entry in zip(env.eval_rows, own, strict=True):
        right = env.reward(_reply(f"Thinking.\n<answer>{entry['answer']}</answer>"), row, None)
        assert right == {f"reasoning_gym/{task}": own.score_answer(entry["answer"], entry)}
        assert right[f"reasoning_gym/{task}"] == 1.0
        wrong = env.reward(_reply("<answer>banana</answer>"), row, None)
        assert wrong == {f"reasoning_gym/{task}": own.score_answer("banana", entry)} != right
        assert env.reward(_reply("no tag at all"), row, None) == {
            f"reasoning_gym/{task}": own.score_answer(None, entry)}


def test_a_weighted_mix_is_reasoning_gyms_composite_scored_per_task():
    from reasoning_gym.composite import DatasetSpec

    weights = {"chain_sum": 3.0, "leg_counting": 1.0}
    env = reasoning_gym(weights, size=60, seed=3, eval_size=0)
    own = rg.create_dataset("composite", size=60, seed=3, datasets=[
        DatasetSpec(name=n, weight=w, config={}) for n, w in weights.items()])
    assert [e["question"] for e in _entries(env.rows)] == [e["question"] for e in own]
    tasks = [r[ROW_KEY]["task"] for r in env.rows]
    assert set(tasks) == set(weights) and tasks.count("chain_sum") > tasks.count("leg_counting")
    for row in env.rows[:10]:
        task, answer = row[ROW_KEY]["task"], row[ROW_KEY]["entry"]["answer"]
        assert env.reward(_reply(f"<answer>{answer}</answer>"), row, None) == {
            f"reasoning_gym/{task}": 1.0}
    with pytest.raises(ValueError, match="per task"):
        reasoning_gym(weights, size=4, config={"min_terms": 2})


def test_held_out_rows_come_from_another_seed_and_are_never_trained_on():
    env = reasoning_gym("basic_arithmetic", size=300, seed=1, eval_size=64)
    train = {e["question"] for e in _entries(env.rows)}
    held_out = {e["question"] for e in _entries(env.eval_rows)}
    assert len(held_out) > 50 and not train & held_out
    # reasoning-gym makes row i of seed s from Random(s + i): nearby seeds repeat rows, so
    # they are refused, and the default held-out seed is the first one past the training rows.
    shifted = rg.create_dataset("chain_sum", size=5, seed=4)
    assert shifted[0]["question"] == rg.create_dataset("chain_sum", size=5, seed=3)[1]["question"]
    with pytest.raises(ValueError, match="too close to seed 3"):
        reasoning_gym("chain_sum", size=5, seed=3, eval_seed=4)
    with pytest.raises(ValueError, match="too close to seed 100"):
        reasoning_gym("chain_sum", size=5, seed=100, eval_size=10, eval_seed=92)
    default = reasoning_gym("chain_sum", size=50, seed=7, eval_size=8)
    assert default.eval_rows[0]["id"] == "chain_sum-eval58-0"  # 7 + 50 rows + 1 task


def test_an_unknown_task_is_refused_with_close_matches_and_every_name():
    with pytest.raises(ValueError) as info:
        reasoning_gym("chain_sums", size=5)
    message = str(info.value)
    assert "unknown reasoning-gym task 'chain_sums'" in message
    assert "Did you mean 'chain_sum'" in message
    assert all(name in message for name in task_names()) and len(task_names()) > 100
    with pytest.raises(ValueError, match="unknown reasoning-gym task 'nope'"):
        reasoning_gym({"chain_sum": 1.0, "nope": 1.0}, size=5)


@pytest.mark.parametrize(("text", "tag", "line"), [
    ("<answer>1</answer>\nthen <answer> 42 </answer>", "42", "then <answer> 42 </answer>"),
    ("Step one.\nStep two.\n\n  17  \n", None, "17"),
    ("<answer>\n3, 4\n</answer>", "3, 4", "</answer>"),
    ("", None, None),
])
def test_answer_extraction_modes(text, tag, line):
    assert last_answer_tag(text) == tag
    assert last_line(text) == line
    if text:  # reasoning-gym's own rule for tags
        assert last_answer_tag(text) == rg.utils.extract_answer(text)


def test_answer_mode_decides_what_the_verifier_sees():
    row = reasoning_gym("chain_sum", size=1, seed=1, eval_size=0).rows[0]
    answer = row[ROW_KEY]["entry"]["answer"]
    reply = _reply(f"The sum is:\n{answer}")
    component = "reasoning_gym/chain_sum"
    by_line = reasoning_gym("chain_sum", size=1, seed=1, eval_size=0, answer="last_line")
    assert by_line.reward(reply, row, None) == {component: 1.0}
    assert "last line" in by_line.rows[0]["messages"][0]["content"]
    by_tag = reasoning_gym("chain_sum", size=1, seed=1, eval_size=0)
    assert by_tag.reward(reply, row, None) == {component: 0.0}
    custom = reasoning_gym("chain_sum", size=1, seed=1, eval_size=0,
                           answer=lambda text: text.split("is:")[-1].strip())
    assert custom.reward(reply, row, None) == {component: 1.0}
    assert reasoning_gym("chain_sum", size=1, seed=1, eval_size=0, system_prompt="").rows[0][
        "messages"] == [{"role": "user", "content": row["messages"][-1]["content"]}]
    with pytest.raises(ValueError, match="answer must be"):
        reasoning_gym("chain_sum", size=1, answer="first_line")
    # A final tool call is no answer.
    call = AIMessage("", tool_calls=[{"name": "calculator", "args": {"expression": "1"},
                                      "id": "c"}])
    assert by_line.reward({"messages": [call]}, row, None) == {component: 0.0}


def test_a_raising_verifier_is_a_counted_traced_reward_error(monkeypatch):
    env = reasoning_gym("chain_sum", size=2, seed=1, eval_size=0)
    dataset = env.reward.scorers["chain_sum"]

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(dataset, "score_answer", broken)
    row = env.rows[0]
    with pytest.raises(VerifierError, match="chain_sum verifier raised on row"):
        env.reward(_reply("<answer>1</answer>"), row, None)
    trajectories = [Trajectory(row_id=row["id"], final_state=_reply("<answer>1</answer>"))]
    counts = asyncio.run(score(trajectories, {row["id"]: row}, env.reward))
    assert counts["reward_errors"] == 1
    assert trajectories[0].reward == 0.0 and trajectories[0].metrics["reward_error"] == 1.0
    assert "VerifierError" in trajectories[0].error and "KeyError" in trajectories[0].error


def test_the_calculator_is_safe_arithmetic():
    assert calculate("(12+7)*3") == 57 and calculator.invoke({"expression": "7/2"}) == "3.5"
    assert calculator.invoke({"expression": "10/2"}) == "5"
    for bad in ("__import__('os')", "2**999", "x+1", "1" * 300):
        with pytest.raises(ValueError):
            calculate(bad)


def test_the_single_turn_graph_runs_and_is_scored(scripted, qwen_tokenizer):
    env = reasoning_gym("chain_sum", size=2, seed=1, eval_size=2)
    answers = [r[ROW_KEY]["entry"]["answer"] for r in env.eval_rows]
    engine = scripted(qwen_tokenizer, [f"<answer>{answers[0]}</answer>", "<answer>x</answer>"])
    config = sdk.RolloutConfig(n=1, concurrency=1, sampling=sdk.SamplingParams(max_tokens=32))
    trajs = asyncio.run(sdk.arollout_batch(env.graph, env.eval_rows, engine,
                                           tokenizer=qwen_tokenizer, config=config))
    rows = {r["id"]: r for r in env.eval_rows}
    asyncio.run(score(trajs, rows, env.reward))
    assert [t.status for t in trajs] == ["ok", "ok"]
    assert [t.rewards for t in trajs] == [{"reasoning_gym/chain_sum": 1.0},
                                          {"reasoning_gym/chain_sum": 0.0}]
    assert [len(t.calls) for t in trajs] == [1, 1]
    assert {s.node for t in trajs for s in t.trained_segments} == {"solver"}


def test_the_tool_graph_calls_the_calculator_then_answers(scripted, qwen_tokenizer):
    env = reasoning_gym("chain_sum", size=1, seed=1, eval_size=1,
                        tools="calculator", config={"min_terms": 3, "max_terms": 3})
    row = env.eval_rows[0]
    entry = row[ROW_KEY]["entry"]
    assert "calculator" in row["messages"][0]["content"] and env.tools == [calculator]
    call = json.dumps({"name": "calculator",
                       "arguments": {"expression": entry["metadata"]["expression"]}})
    engine = scripted(qwen_tokenizer, [f"<tool_call>\n{call}\n</tool_call>",
                                       f"<answer>{entry['answer']}</answer>"])
    config = sdk.RolloutConfig(n=1, sampling=sdk.SamplingParams(max_tokens=64))
    (traj,) = asyncio.run(sdk.arollout_batch(env.graph, [row], engine,
                                             tokenizer=qwen_tokenizer, config=config))
    asyncio.run(score([traj], {row["id"]: row}, env.reward))
    assert traj.status == "ok" and len(traj.calls) == 2
    tool_reply = traj.final_state["messages"][3]
    assert tool_reply.type == "tool" and int(tool_reply.content) == int(entry["answer"])
    assert traj.rewards == {"reasoning_gym/chain_sum": 1.0}


@pytest.mark.slow
def test_a_real_rollout_of_smollm2_through_evaluate(smollm2_folder, tmp_path):
    env = reasoning_gym("leg_counting", size=2, seed=1, eval_size=4)
    config = {"model": {"path": str(smollm2_folder)},
              "rollout": {"sampling": {"max_tokens": 24}},
              "tracking": {"enabled": False}}
    result = sdk.evaluate(env.graph, env.eval_rows, env.reward, config)
    assert result.metrics["rollouts"] == 4.0
    assert all(t.status in ("ok", "truncated") for t in result.trajectories)
    assert "reward/reasoning_gym/leg_counting" in result.metrics
    assert all(t.calls and t.calls[0].response_ids for t in result.trajectories)
