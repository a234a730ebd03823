"""The calculator example: its safe evaluator, and its rollout demo run briefly end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl_sdk.cli import app
from examples.calculator.calculator import calculate


@pytest.mark.parametrize(
    ("expression", "value"), [("(2+3)*4", 20), ("-7//2", -4), ("2**10", 1024), ("1.5*2", 3.0)]
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('true')", "x+1", "2**99999", "[1][0]", "1 +"]
)
def test_calculator_refuses_anything_else(expression):
    with pytest.raises(ValueError):
        calculate(expression)


@pytest.mark.slow
async def test_rollout_demo_writes_three_turn_trajectories(tmp_path):
    # The run's shared cache, not a private one: the warm start (minutes on 2 cores) is then
    # built once per run for this demo and examples/openai_agent alike.
    from examples.calculator import rollout_demo
    from examples.calculator.model import model_path

    out = tmp_path / "trajectories.jsonl"
    await rollout_demo.main(rows=2, n=2, out=out)

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    assert {r["status"] for r in rows} == {"ok"}
    # The warm-started policy uses the tool twice, then answers: three calls, one segment.
    assert [len(r["calls"]) for r in rows] == [3, 3, 3, 3]
    assert all(len(r["segments"]) == 1 for r in rows)

    model_dir = model_path()  # the folder the demo loaded its policy from
    shown = CliRunner().invoke(app, ["show", str(out), "--model-dir", str(model_dir), "--limit", "1"])
    assert shown.exit_code == 0, shown.output
    assert '{"name":"calculator","arguments":{"expression":' in shown.output
    assert "3 calls" in shown.output
