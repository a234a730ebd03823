"""GAE over mask-1 tokens, the clipped value loss and explained variance against hand-computed
values, on sequences with observation (mask-0) tokens inside them."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_sdk.algorithms import (
    compute_gae,
    explained_variance,
    masked_whiten,
    value_loss,
)

# Row 0: two sampled tokens, a two-token tool response (mask 0), one sampled token, padding.
# Row 1: a leading observation, three sampled tokens, padding. Row 2: nothing sampled.
MASK = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
VALUES = torch.tensor([
    [0.5, 0.2, 9.0, 9.0, 0.4, 7.0],
    [3.0, 0.0, 0.1, 0.3, 5.0, 5.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
])  # fmt: skip
REWARDS = torch.tensor([1.0, -1.0, 2.0])


def test_gae_matches_hand_computed_values_across_observation_tokens():
    adv, ret = compute_gae(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    # Row 0, sampled tokens t = 0, 1, 4 (t = 2, 3 are a tool response: no TD step there).
    # t=4: delta = 1 - 0.4 = 0.6;                A = 0.6
    # t=1: delta = 0.9 * 0.4 - 0.2 = 0.16;       A = 0.16 + 0.72 * 0.6 = 0.592
    # t=0: delta = 0.9 * 0.2 - 0.5 = -0.32;      A = -0.32 + 0.72 * 0.592 = 0.10624
    # Row 1, sampled tokens t = 1, 2, 3; the reward -1 lands on t = 3.
    # t=3: delta = -1 - 0.3 = -1.3;              A = -1.3
    # t=2: delta = 0.9 * 0.3 - 0.1 = 0.17;       A = 0.17 + 0.72 * -1.3 = -0.766
    # t=1: delta = 0.9 * 0.1 - 0.0 = 0.09;       A = 0.09 + 0.72 * -0.766 = -0.46152
    want_adv = [
        [0.10624, 0.592, 0, 0, 0.6, 0],
        [0, -0.46152, -0.766, -1.3, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    want_ret = [
        [0.60624, 0.792, 0, 0, 1.0, 0],
        [0, -0.46152, -0.666, -1.0, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    assert adv.tolist() == [pytest.approx(r, abs=1e-6) for r in want_adv]
    assert ret.tolist() == [pytest.approx(r, abs=1e-6) for r in want_ret]


def test_gae_ignores_the_values_of_observation_tokens():
    other = VALUES.clone()
    other[MASK == 0] = -50.0  # the critic's guesses inside tool responses and padding
    for a, b in zip(compute_gae(REWARDS, VALUES, MASK, 0.9, 0.8),
                    compute_gae(REWARDS, other, MASK, 0.9, 0.8), strict=True):
        assert torch.equal(a, b)


def test_gae_with_gamma_and_lambda_one_returns_the_reward_at_every_sampled_token():
    adv, ret = compute_gae(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    assert ret[1].tolist() == pytest.approx([0.0, -1.0, -1.0, -1.0, 0.0, 0.0])
    assert torch.allclose(adv, torch.where(MASK.bool(), ret - VALUES, 0.0))


def test_gae_lambda_zero_is_one_step_td():
    adv, _ = compute_gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.0)
    assert adv[0].tolist() == pytest.approx([0.2 - 0.5, 0.4 - 0.2, 0, 0, 1.0 - 0.4, 0])


def test_value_loss_matches_hand_computed_values():
    values = torch.tensor([[0.5, 1.0, 0.0], [9.0, -0.5, 0.3]], requires_grad=True)
    old = torch.tensor([[0.0, 0.9, 0.0], [9.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 0.0, 0.0], [9.0, 0.5, 0.2]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    loss, metrics = value_loss(values, old, returns, mask, cliprange_value=0.2)
    # (0,0): (V-R)^2 = 0.25, clipped V = 0.2: (0.2-1)^2 = 0.64 wins -> 0.32 (clipped)
    # (0,1): 1.0 both (V within the range)                          -> 0.5
    # (1,1): (V-R)^2 = 1.0, clipped V = -0.2: 0.49                   -> 0.5
    # (1,2): (V-R)^2 = 0.01, clipped V = 0.2: 0.0                    -> 0.005
    assert loss.item() == pytest.approx((0.32 + 0.5 + 0.5 + 0.005) / 4)
    assert metrics["value_loss"] == pytest.approx(0.33125)
    assert metrics["clip_fraction"] == pytest.approx(0.25)
    assert metrics["values_mean"] == pytest.approx((0.5 + 1.0 - 0.5 + 0.3) / 4)
    loss.backward()
    # The clipped term is constant in V where it wins; mask-0 tokens get no gradient.
    assert values.grad.tolist() == [
        pytest.approx([0.0, 1.0 / 4, 0.0]),
        pytest.approx([0.0, -1.0 / 4, 0.1 / 4]),
    ]


def test_value_loss_seq_mean_token_mean():
    values = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    zeros = torch.zeros(2, 2)
    loss, _ = value_loss(values, values, zeros, torch.tensor([[1, 1], [1, 0]]),
                         agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((0.5 + 0.0) / 2)


def test_explained_variance():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    returns = torch.tensor([[1.0, 2.0, 4.0, -100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # Var(R) = 14/9, Var(R - V) = 2/9 (population) -> 1 - 1/7.
    assert explained_variance(values, returns, mask) == pytest.approx(6 / 7)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert math.isnan(explained_variance(values, torch.ones(1, 4), mask))


def test_masked_whiten():
    x = torch.tensor([[1.0, 5.0, 3.0], [100.0, 2.0, 4.0]])
    mask = torch.tensor([[1, 0, 1], [0, 1, 1]])
    out = masked_whiten(x, mask, eps=0.0)
    # Entries 1, 3, 2, 4: mean 2.5, unbiased var 5/3.
    want = [(v - 2.5) / math.sqrt(5 / 3) for v in (1.0, 3.0, 2.0, 4.0)]
    assert out[mask.bool()].tolist() == pytest.approx(want)
    assert out[~mask.bool()].tolist() == [0.0, 0.0]
