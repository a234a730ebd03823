"""Evaluation metrics and settings: pass@k against hand-computed values, pure functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.pipeline import EvalConfig, TrainConfig
from agentrl_sdk.pipeline.metrics import eval_metrics, pass_at_k
from agentrl_sdk.types import SamplingParams, Trajectory


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 0, 1, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2)
    (4, 2, 2, 5 / 6), (4, 1, 4, 1.0), (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
])  # fmt: skip
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_properties(n_c):
    n, c = n_c
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert values[0] == pytest.approx(c / n)  # pass@1 is the pass rate
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:], strict=False))  # rises with k
    assert values[-1] == (1.0 if c else 0.0)  # all n samples: any pass


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def _traj(row: str, index: int, reward: float | None, status: str = "ok") -> Trajectory:
    return Trajectory(row_id=row, sample_index=index, reward=reward, status=status)


def test_eval_metrics_average_pass_at_k_over_rows():
    # Row a: 2 of 4 pass; row b: none (one unscored, one failed rollout); row c: all 4 pass.
    trajectories = [
        *(_traj("a", i, r) for i, r in enumerate([1.0, 0.5, 1.0, 0.0])),
        *(_traj("b", i, r) for i, r in enumerate([0.0, None, 0.2, 0.0])),
        *(_traj("c", i, 1.5) for i in range(4)),
    ]
    trajectories[7].status = "timeout"
    m = eval_metrics(trajectories, 2.0, pass_threshold=1.0)
    assert m["pass_at_1"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert m["pass_at_2"] == pytest.approx((5 / 6 + 0.0 + 1.0) / 3)
    assert m["pass_at_4"] == pytest.approx(2 / 3)
    assert set(k for k in m if k.startswith("pass_at_")) == {"pass_at_1", "pass_at_2", "pass_at_4"}
    assert m["rows"] == 3.0 and m["rollouts"] == 12.0
    scored = [1.0, 0.5, 1.0, 0.0, 0.0, 0.2, 0.0, 1.5, 1.5, 1.5, 1.5]
    assert m["reward/mean"] == pytest.approx(sum(scored) / len(scored))
    assert m["status/ok"] == 11.0 and m["status/timeout"] == 1.0
    # A lower threshold lets row b's 0.2 pass.
    assert eval_metrics(trajectories, 2.0, pass_threshold=0.2)["pass_at_1"] == pytest.approx(
        (0.75 + 0.25 + 1.0) / 3)


def test_eval_metrics_k_values_stop_at_the_samples_per_row():
    m = eval_metrics([_traj(str(r), i, 1.0) for r in range(2) for i in range(3)], 1.0)
    assert {k for k in m if k.startswith("pass_at_")} == {"pass_at_1", "pass_at_2", "pass_at_3"}
    assert math.isclose(m["pass_at_3"], 1.0)


def test_eval_sampling_defaults_to_greedy_with_the_rollout_budget():
    rollout = RolloutConfig(n=8, sampling=SamplingParams(temperature=1.0, max_tokens=32, seed=3))
    evaluated = EvalConfig().rollout(rollout)
    assert evaluated.n == 1 and evaluated.sampling.temperature == 0.0
    assert evaluated.sampling.max_tokens == 32 and evaluated.chat == rollout.chat
    custom = SamplingParams(temperature=0.7, max_tokens=16, seed=1)
    assert EvalConfig(n=4, sampling=custom).rollout(rollout).sampling == custom


def test_eval_n_above_one_needs_sampling_that_can_differ():
    with pytest.raises(ValueError, match=r"evaluation.n \(4\) needs evaluation.sampling"):
        TrainConfig.model_validate({"evaluation": {"n": 4}})
    with pytest.raises(ValueError, match="temperature > 0"):
        EvalConfig(n=2, sampling=SamplingParams(temperature=0.0))


@pytest.mark.parametrize(("every", "before", "updates", "due"), [
    (0, True, 0, False), (0, True, 5, False), (2, True, 0, True), (2, False, 0, False),
    (2, True, 1, False), (2, True, 2, True), (2, True, 4, True), (3, True, 4, False),
])  # fmt: skip
def test_eval_schedule(every, before, updates, due):
    assert EvalConfig(every=every, before_train=before).due(updates) is due
