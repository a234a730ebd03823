"""The step-level estimator (and GiGPO) against hand-computed references."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_sdk.algorithms import Sequences, compute_grpo_advantages, compute_rloo_advantages
from agentrl_sdk.algorithms.estimators import StepEstimator, discounted_returns


def compute_step_advantages(rewards, rollout, group_ids, anchor_ids=None, **options):
    """The step estimator's advantages, one per call (every call one token long)."""
    seqs = Sequences(rewards=torch.zeros(len(rollout), dtype=torch.float64), rollout=rollout,
                     group_ids=group_ids, mask=torch.ones(len(rollout), 1),
                     step_rewards=rewards, anchor_ids=anchor_ids)  # fmt: skip
    estimate = StepEstimator(**options)(seqs)
    return estimate.advantages[:, 0], estimate.metrics


def test_discounted_returns_restart_at_every_rollout():
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 3.0])
    rollout = torch.tensor([0, 0, 0, 1, 2])
    returns = discounted_returns(rewards, rollout, gamma=0.5)
    # rollout 0: G3 = 2, G2 = 0 + 0.5 * 2 = 1, G1 = 1 + 0.5 * 1 = 1.5
    assert returns.tolist() == [1.5, 1.0, 2.0, 0.5, 3.0]


def test_grpo_step_advantages_by_hand():
    # Group g: rollout 0 (calls r = 1, 0, 2; returns 1.5, 1, 2) and rollout 1 (one call, 0.5).
    # Rollout returns 1.5 and 0.5: mean 1, unbiased std sqrt(0.5). Rollout 2 is alone.
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 7.0])
    rollout = torch.tensor([0, 0, 0, 1, 2])
    adv, metrics = compute_step_advantages(rewards, rollout, ["g", "g", "h"], gamma=0.5, eps=0.0)
    s = math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([0.5 / s, 0.0, 1.0 / s, -0.5 / s, 0.0])
    assert metrics["step_return_mean"] == pytest.approx((1.5 + 1 + 2 + 0.5 + 7) / 5)

    rloo, _ = compute_step_advantages(rewards, rollout, ["g", "g", "h"], gamma=0.5,
                                      baseline="rloo")
    # Baselines: rollout 0 against 0.5, rollout 1 against 1.5.
    assert rloo.tolist() == pytest.approx([1.0, 0.5, 1.5, -1.0, 0.0])


def test_a_flat_group_keeps_the_signal_of_single_calls():
    # Both rollouts return 1 in total, but rollout 0 earned it on its first call.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_step_advantages(rewards, torch.tensor([0, 0, 1, 1]), ["g", "g"])
    assert adv.tolist() == pytest.approx([0.0, -1.0, 0.0, 0.0])  # std 0: centred, not scaled


@pytest.mark.parametrize(("baseline", "reference"), [
    ("grpo", compute_grpo_advantages), ("rloo", compute_rloo_advantages)])
def test_outcome_only_rewards_give_the_rollout_level_advantages(baseline, reference):
    outcomes = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0], dtype=torch.float64)
    groups = ["a", "a", "a", "b", "b"]
    calls = [3, 1, 2, 2, 1]
    rollout = torch.repeat_interleave(torch.arange(5), torch.tensor(calls))
    last = torch.cumsum(torch.tensor(calls), 0) - 1
    rewards = torch.zeros(sum(calls), dtype=torch.float64).index_put((last,), outcomes)
    adv, _ = compute_step_advantages(rewards, rollout, groups, gamma=1.0, baseline=baseline)
    expected, _ = reference(outcomes, groups)
    assert adv.tolist() == pytest.approx(expected[rollout].tolist(), abs=1e-9)


def test_anchor_step_groups_by_hand():
    # Three rollouts of one row, two calls each; all start from anchor s0, then rollouts 0 and 2
    # reach the same state s1 and rollout 1 another one, s2. Only rollout 0's second call pays.
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    rollout = torch.tensor([0, 0, 1, 1, 2, 2])
    anchors = ["s0", "s1", "s0", "s2", "s0", "s1"]
    adv, metrics = compute_step_advantages(rewards, rollout, ["g"] * 3, anchors, gamma=0.5,
                                           baseline="drgrpo", omega=1.0)
    # Episode: totals 1, 0, 0 -> 2/3, -1/3, -1/3. Steps, returns G = 0.5, 1 | 0, 0 | 0, 0:
    # s0 {0.5, 0, 0} -> 1/3, -1/6, -1/6; s1 {1, 0} -> 1/2, -1/2; s2 alone -> 0.
    assert adv.tolist() == pytest.approx([1.0, 7 / 6, -0.5, -1 / 3, -0.5, -5 / 6])
    assert metrics["step_groups"] == 3.0

    half, _ = compute_step_advantages(rewards, rollout, ["g"] * 3, anchors, gamma=0.5,
                                      baseline="drgrpo", omega=0.0)
    assert half.tolist() == pytest.approx([2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3])
