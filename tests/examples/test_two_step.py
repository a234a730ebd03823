"""The two-step task (the tree benchmark's second task): problems whose first step adds or
subtracts, demonstrations with one calculator call per step, the second sentences left to RL."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from examples.calculator.calculator import calculate
from examples.two_step.agent import (
    DEMONSTRATED,
    SECOND,
    TRAINING_WEIGHTS,
    demonstration,
    held_out_rows,
    make_rows,
    training_rows,
)
from examples.two_step.model import demonstrations


def test_problems_take_two_whole_number_steps_the_first_adding_or_subtracting():
    rows = make_rows(300, seed=3)
    assert rows == make_rows(300, seed=3)
    assert {r["operations"][0] for r in rows} == set("+-")
    assert {r["operations"][1] for r in rows} == set("+-*/")
    for row in rows:
        first, second = row["steps"]
        middle = calculate(first)
        assert float(middle).is_integer() and middle > 0
        assert second.startswith(str(int(middle)) + row["operations"][1])
        answer = calculate(second)
        assert float(answer).is_integer() and answer > 0 and str(int(answer)) == row["answer"]
    held_out = {r["messages"][1]["content"] for r in held_out_rows()}
    assert len(held_out) == 64
    assert not held_out & {r["messages"][1]["content"] for r in training_rows()}


def test_training_practises_mostly_the_undemonstrated_second_sentences():
    seconds = Counter(r["second"] for r in training_rows())
    total = sum(seconds.values())
    weight = sum(TRAINING_WEIGHTS.values())
    assert {name: n / total for name, n in seconds.items()} == pytest.approx(
        {name: w / weight for name, w in TRAINING_WEIGHTS.items()}, abs=0.04)
    left = set(SECOND) - set(DEMONSTRATED)
    assert {SECOND[name][0] for name in left} == set("*/")
    assert sum(seconds[name] for name in left) / total > 0.5


def test_a_demonstration_makes_one_call_per_step_then_answers():
    row = make_rows(1, seed=2)[0]
    turns = demonstration(row)[2:]
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    calls = [json.loads(t["content"].split("\n")[1])["arguments"]["expression"]
             for t in turns[0:4:2]]
    assert calls == row["steps"]
    assert turns[1]["content"] == row["steps"][1].split(row["operations"][1])[0]
    assert turns[3]["content"] == row["answer"]
    assert turns[4]["content"] == f"The answer is {row['answer']}."
    shown = demonstrations()
    assert len(shown) == 400
    assert {json.loads(d[4]["content"].split("\n")[1])["arguments"]["expression"].strip(
        "0123456789")[:1] for d in shown} == {"+", "-", "*", "/"}
    endings = {SECOND[name][1].split("{c}")[0] for name in DEMONSTRATED}
    assert all(any(e in d[1]["content"] for e in endings) for d in shown)  # none left to RL


def test_config_validates():
    from agentrl_sdk.pipeline import TrainConfig

    config = TrainConfig.from_yaml(Path("examples/two_step/config.yaml"))
    assert config.rollout.recursion_limit >= 5  # solver, tools, solver, tools, solver
    assert config.model.builder == "examples.two_step.model:model_path"
