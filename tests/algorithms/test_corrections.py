"""Off-policy importance weights against a loop reference, and their use in the policy loss."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentrl_sdk.algorithms import PolicyLossConfig, importance_weights, ppo_policy_loss

PROX = [[-1.0, -2.0, -0.5, -3.0], [-0.2, -4.0, -1.5, -0.7]]
BEHAV = [[-1.5, -1.0, -0.5, -4.5], [-0.1, -1.0, -2.5, -0.7]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1]]


def ref_weights(prox, behav, mask, correction, cap):
    """Plain loops: w = exp(prox - behav); tis truncates at cap, decoupled drops above it."""
    out = []
    for p_row, b_row, m_row in zip(prox, behav, mask, strict=True):
        row = []
        for p, b, m in zip(p_row, b_row, m_row, strict=True):
            w = math.exp(p - b)
            if not m:
                row.append(0.0)
            elif correction == "none":
                row.append(1.0)
            elif correction == "tis":
                row.append(min(w, cap))
            else:
                row.append(0.0 if cap is not None and w > cap else w)
        out.append(row)
    return out


@pytest.mark.parametrize(
    ("correction", "cap"),
    [("none", 2.0), ("tis", 2.0), ("tis", 1.2), ("decoupled", 2.0), ("decoupled", None)],
)
def test_weights_equal_the_reference(correction, cap):
    t = torch.tensor
    weights, metrics = importance_weights(t(PROX), t(BEHAV), t(MASK), correction, cap)
    expected = torch.tensor(ref_weights(PROX, BEHAV, MASK, correction, cap))
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
    raw = [math.exp(p - b) for pr, br, mr in zip(PROX, BEHAV, MASK, strict=True)
           for p, b, m in zip(pr, br, mr, strict=True) if m]  # fmt: skip
    assert metrics["is_weight_mean"] == pytest.approx(sum(raw) / len(raw), abs=1e-6)
    assert metrics["is_weight_max"] == pytest.approx(max(raw), abs=1e-6)
    assert metrics["is_weight_min"] == pytest.approx(min(raw), abs=1e-6)
    kl = sum(w - 1 - math.log(w) for w in raw) / len(raw)
    assert metrics["mismatch_kl"] == pytest.approx(kl, abs=1e-6)
    capped = sum(w > cap for w in raw) / len(raw) if cap is not None else 0.0
    assert metrics["is_capped_frac"] == pytest.approx(capped, abs=1e-6)


def test_on_policy_tokens_weigh_one_and_show_no_mismatch():
    logp = torch.tensor([[-0.3, -2.0, -1.1]])
    weights, metrics = importance_weights(logp, logp.clone(), torch.ones(1, 3), "tis", 2.0)
    assert weights.tolist() == [[1.0, 1.0, 1.0]]
    assert metrics["mismatch_kl"] == 0.0 and metrics["is_capped_frac"] == 0.0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0), st.booleans()), min_size=1,
             max_size=24),
    st.sampled_from(["tis", "decoupled"]),
    st.floats(1.01, 5.0),
)  # fmt: skip
def test_weights_are_bounded_and_masked(tokens, correction, cap):
    prox, behav, mask = (torch.tensor([[x[i] for x in tokens]]) for i in range(3))
    weights, _ = importance_weights(prox, behav, mask.float(), correction, cap)
    assert (weights[~mask] == 0).all()
    assert (weights >= 0).all() and (weights <= cap + 1e-6).all()


def test_weighted_loss_scales_each_token_and_gives_masked_tokens_no_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0])
    w = torch.tensor([[0.5, 2.0, 7.0]])
    loss, _ = ppo_policy_loss(logp, old, adv, mask, token_weights=w)
    # ratio 1 everywhere: the loss is -(0.5 + 2.0) / 2 trained tokens.
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -1.0, 0.0])


def test_shape_and_config_errors():
    with pytest.raises(ValueError, match="same shape"):
        importance_weights(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="needs a cap"):
        importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "tis", None)
    with pytest.raises(ValidationError, match="is_cap"):
        PolicyLossConfig(correction="tis", is_cap=None)
