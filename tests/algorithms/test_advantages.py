"""Group advantage estimators against hand-computed values and a plain-Python reference."""

from __future__ import annotations

import math
from typing import get_args

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_sdk.algorithms import (
    AdvantageEstimator,
    compute_grpo_advantages,
    compute_rloo_advantages,
)
from agentrl_sdk.algorithms.estimators import GroupEstimator

SETTINGS = settings(max_examples=50, deadline=None)


def compute_advantages(name: str, rewards: torch.Tensor, groups: list) -> tuple:
    return GroupEstimator(baseline=name).rollout_advantages(rewards, groups)  # type: ignore[arg-type]


def ref_advantages(name: str, rewards: list[float], groups: list, eps: float = 1e-6) -> list[float]:
    """Independent reference: one loop per rollout over its group's rewards."""
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        n = len(members)
        if n == 1 or max(members) == min(members):
            out.append(0.0)
        elif name == "rloo":
            out.append(r - (sum(members) - r) / (n - 1))
        elif name == "drgrpo":
            out.append(r - float(np.mean(members)))
        else:
            out.append((r - float(np.mean(members))) / (float(np.std(members, ddof=1)) + eps))
    return out


# Rollouts as (group, reward) pairs: few groups so that groups have several members.
rollouts = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.sampled_from([0.0, 0.1, 0.5, 1.0]), st.floats(-5, 5, allow_nan=False)),
    ),
    min_size=1,
    max_size=12,
)


def test_hand_computed_one_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    groups = ["a"] * 4
    adv, _ = compute_grpo_advantages(rewards, groups, eps=0.0)
    # mean 0.5, unbiased std sqrt(1/3): +-0.5 * sqrt(3) = +-sqrt(3)/2
    h = math.sqrt(3) / 2
    assert adv.tolist() == pytest.approx([h, -h, -h, h], abs=1e-12)
    adv, _ = compute_advantages("drgrpo", rewards, groups)
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5], abs=1e-12)
    adv, _ = compute_rloo_advantages(rewards, groups)
    # r=1: 1 - (1/3); r=0: 0 - (2/3)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-12)


def test_groups_are_independent_and_metrics():
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.7, 0.7, 0.7, 2.0])
    groups = [("r1", "p"), ("r1", "p"), ("r1", "q"), ("r2", "p"), ("r2", "p"), ("r2", "p"), "x"]
    adv, metrics = compute_grpo_advantages(rewards, groups)
    # group (r1,p): +-1/sqrt(2) over std sqrt(0.5); (r1,q) and x are singletons; r2 is flat
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv.tolist() == pytest.approx([s, -s, 0, 0, 0, 0, 0], abs=1e-6)
    assert adv[3:6].eq(0).all()  # 0.7 * 3 / 3 != 0.7 in floats; still exactly 0
    assert metrics["adv_groups"] == 4.0
    assert metrics["adv_zero_std_group_frac"] == 0.75
    assert metrics["adv_mean"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["adv_std"] == pytest.approx(float(np.std(adv.numpy())), abs=1e-6)


def test_tensor_group_ids_match_hashables():
    rewards = torch.tensor([0.0, 1.0, 1.0, 5.0, 2.0], dtype=torch.float64)
    by_list, _ = compute_rloo_advantages(rewards, [7, 3, 7, 3, 7])
    by_tensor, _ = compute_rloo_advantages(rewards, torch.tensor([7, 3, 7, 3, 7]))
    rows = torch.tensor([[7, 0], [3, 1], [7, 0], [3, 1], [7, 0]])
    by_rows, _ = compute_rloo_advantages(rewards, rows)
    assert torch.equal(by_list, by_tensor) and torch.equal(by_list, by_rows)


def test_integer_rewards_become_float():
    adv, _ = compute_grpo_advantages(torch.tensor([1, 0]), ["g", "g"])
    assert adv.dtype == torch.get_default_dtype()
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv.tolist() == pytest.approx([a, -a])


def test_an_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="Input should be 'grpo', 'drgrpo' or 'rloo'"):
        GroupEstimator(baseline="ppo")  # type: ignore[arg-type]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="rows \\[1\\]"):
        compute_grpo_advantages(torch.tensor([0.0, float("nan")]), [0, 0])
    with pytest.raises(ValueError, match="group_ids has 3 entries but rewards has 2"):
        compute_grpo_advantages(torch.tensor([0.0, 1.0]), [0, 0, 0])
    with pytest.raises(ValueError, match="shape \\(N,\\)"):
        compute_grpo_advantages(torch.zeros(2, 2), [0, 0])


def test_empty_batch():
    adv, metrics = compute_grpo_advantages(torch.zeros(0), [])
    assert adv.shape == (0,)
    assert metrics["adv_groups"] == 0.0


@SETTINGS
@given(rollouts, st.sampled_from(get_args(AdvantageEstimator)))
def test_matches_reference(rows, name):
    groups = [g for g, _ in rows]
    rewards = [r for _, r in rows]
    adv, _ = compute_advantages(name, torch.tensor(rewards, dtype=torch.float64), groups)
    assert adv.tolist() == pytest.approx(ref_advantages(name, rewards, groups), abs=1e-6)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(1, 5), st.floats(-3, 3, allow_nan=False)), min_size=1, max_size=5
    ),
    st.sampled_from(get_args(AdvantageEstimator)),
)
def test_zero_variance_groups_give_zero(groups_spec, name):
    groups = [g for g, (size, _) in enumerate(groups_spec) for _ in range(size)]
    rewards = [value for size, value in groups_spec for _ in range(size)]
    adv, metrics = compute_advantages(name, torch.tensor(rewards), groups)
    assert adv.eq(0).all()
    assert metrics["adv_zero_std_group_frac"] == 1.0


@SETTINGS
@given(rollouts, st.sampled_from(get_args(AdvantageEstimator)), st.randoms(use_true_random=False))
def test_shuffling_rows_permutes_advantages(rows, name, rnd):
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    rewards = torch.tensor([r for _, r in rows], dtype=torch.float64)
    groups = [g for g, _ in rows]
    adv, _ = compute_advantages(name, rewards, groups)
    adv_perm, _ = compute_advantages(name, rewards[perm], [groups[i] for i in perm])
    assert adv_perm.tolist() == pytest.approx(adv[perm].tolist(), abs=1e-9)
