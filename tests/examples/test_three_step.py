"""The three-step task (where benchmarks/tree.py shows trees paying): two routine steps that add
or subtract, then the two-step task's deciding sentence; demonstrations with one calculator call
per step; its recipe branches after the second tool result."""

from __future__ import annotations

import json
from pathlib import Path

from examples.calculator.calculator import calculate
from examples.three_step.agent import DEMONSTRATED, MIDDLE, SECOND, held_out_rows, make_rows
from examples.three_step.agent import training_rows
from examples.three_step.model import RECIPE, demonstrations


def test_problems_take_three_whole_number_steps_the_first_two_adding_or_subtracting():
    rows = make_rows(400, seed=3)
    assert rows == make_rows(400, seed=3)
    assert {r["operations"][:2] for r in rows} == {"++", "+-", "-+", "--"}
    assert {r["operations"][2] for r in rows} == set("+-*/")
    for row in rows:
        value = None
        for step, operation in zip(row["steps"], row["operations"], strict=True):
            if value is not None:
                assert step.startswith(f"{value}{operation}")
            result = calculate(step)
            assert float(result).is_integer() and result > 0
            value = int(result)
        assert str(value) == row["answer"]
        assert any(m.split("{m}")[0] in row["messages"][1]["content"] for _, m in MIDDLE)
    held_out = {r["messages"][1]["content"] for r in held_out_rows()}
    assert len(held_out) == 64
    assert not held_out & {r["messages"][1]["content"] for r in training_rows()}


def test_a_demonstration_makes_three_calls_and_shows_only_the_demonstrated_endings():
    shown = demonstrations()
    assert len(shown) == RECIPE["rows"]
    turns = shown[0][2:]
    assert [t["role"] for t in turns] == ["assistant", "tool"] * 3 + ["assistant"]
    endings = {SECOND[name][1].split("{c}")[0] for name in DEMONSTRATED}
    assert all(any(e in d[1]["content"] for e in endings) for d in shown)
    calls = {json.loads(d[6]["content"].split("\n")[1])["arguments"]["expression"].strip(
        "0123456789")[:1] for d in shown}
    assert calls == {"+", "-", "*", "/"}


def test_config_branches_after_the_second_tool_result():
    from agentrl_sdk.pipeline import TrainConfig

    config = TrainConfig.from_yaml(Path("examples/three_step/config.yaml"))
    assert config.rollout.recursion_limit >= 7  # solver and tools three times, then solver
    assert not config.rollout.tree.enabled and config.rollout.tree.skip_first == 1
    assert config.model.builder == "examples.three_step.model:model_path"
