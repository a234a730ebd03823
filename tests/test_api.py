"""`sdk.train` wiring: epochs become steps, held-out rows reach the pipeline (pipeline stubbed)."""

from __future__ import annotations

import pytest

import agentrl_sdk as sdk
from agentrl_sdk import api


@pytest.fixture
def captured(monkeypatch):
    """Replaces the training loop with one that records what it was given."""
    seen: dict = {}

    async def pipeline(spec, schedule, **kwargs):
        seen.update(rows=spec.rows, config=spec.config, eval_rows=spec.eval_rows,
                    skipped_rows=spec.skipped_rows)
        return sdk.TrainResult(steps=spec.config.max_steps)

    monkeypatch.setattr(api, "run_pipeline", pipeline)
    return seen


async def _agent(endpoint, row):  # never runs: the pipeline is stubbed
    raise AssertionError("the stubbed pipeline runs no rollout")


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]}
            for i in range(start, start + n)]


def test_epochs_set_max_steps_from_full_batches(captured):
    config = {"epochs": 3, "max_steps": 99, "data": {"batch_size": 4}}
    assert sdk.train(_agent, _rows(10), None, config).steps == 6  # 3 x (10 // 4)
    assert captured["config"].max_steps == 6
    assert sdk.train(_agent, _rows(10), None, {"max_steps": 5}).steps == 5  # no epochs


def test_held_out_rows_are_validated_and_passed_on(captured):
    held_out = _rows(3, start=100) + [{"id": "bad", "prompt": []}]
    sdk.train(_agent, _rows(8), None, {"evaluation": {"every": 2}}, eval_dataset=held_out)
    assert [r["id"] for r in captured["eval_rows"]] == ["r100", "r101", "r102"]
    assert captured["skipped_rows"] == 1  # the held-out row with an empty prompt


def test_a_reward_function_with_the_wrong_parameters_is_refused_at_start(captured):
    def two(state, row):
        return 1.0

    with pytest.raises(TypeError, match=r"reward\(final_state, row, trajectory\)"):
        sdk.train(_agent, _rows(4), two, {"max_steps": 1})
    assert not captured  # refused before the pipeline ran

    def flexible(state, *rest, **extra):  # anything that takes the three arguments runs
        return 1.0

    for ok in (flexible, lambda s, r, t: 1.0, None):
        assert sdk.train(_agent, _rows(4), ok, {"max_steps": 1}).steps == 1
    with pytest.raises(TypeError, match="must be a function"):
        sdk.train(_agent, _rows(4), "reward", {"max_steps": 1})
