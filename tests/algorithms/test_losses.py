"""Policy loss, aggregation, KL and entropy against hand-computed values and loop references."""

from __future__ import annotations

import math
from typing import get_args

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import agentrl_sdk.algorithms as algorithms
from agentrl_sdk.algorithms import (
    LossAgg,
    PolicyLossConfig,
    aggregate,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    loss_shares,
    micro_batch_share,
    ppo_policy_loss,
    sequence_mass,
    token_share,
)

SETTINGS = settings(max_examples=50, deadline=None)
AGGS: tuple[str, ...] = get_args(LossAgg)


# ---- independent references: plain loops over nested lists ----

def ref_aggregate(L, m, agg, w=None):
    B, T = len(L), len(L[0])
    w = w if w is not None else [1.0] * B
    if agg == "token-mean":
        num = sum(w[i] * L[i][t] for i in range(B) for t in range(T) if m[i][t])
        den = sum(w[i] for i in range(B) for t in range(T) if m[i][t])
        return num / den if den else 0.0
    num = den = 0.0
    for i in range(B):
        n = sum(1 for t in range(T) if m[i][t])
        if n == 0:
            continue
        s = sum(L[i][t] for t in range(T) if m[i][t])
        if agg == "seq-mean-token-mean":
            s /= n
        elif agg == "seq-mean-token-sum-norm":
            s /= T
        num += w[i] * s
        den += w[i]
    return num / den if den else 0.0


def ref_pg_matrix(logp, logp_old, adv, clip_low, clip_high, clip_c):
    out = []
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[0])):
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            r = math.exp(logp[i][t] - logp_old[i][t])
            loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if clip_c is not None and a < 0:
                loss = min(loss, -a * clip_c)
            row.append(loss)
        out.append(row)
    return out


def ref_kl(logp, ref, kind):
    x = ref - logp
    return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - x - 1}[kind]


# ---- strategies: small random batches ----

@st.composite
def batches(draw, per_token_adv=None):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 5))
    vals = st.floats(-2.0, 0.0, allow_nan=False)
    logp = draw(st.lists(st.lists(vals, min_size=T, max_size=T), min_size=B, max_size=B))
    shift = st.floats(-0.6, 0.6, allow_nan=False)
    old = [[x + draw(shift) for x in row] for row in logp]
    mask = draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B))
    token_adv = draw(st.booleans()) if per_token_adv is None else per_token_adv
    advs = st.floats(-2, 2, allow_nan=False)
    if token_adv:
        adv = draw(st.lists(st.lists(advs, min_size=T, max_size=T), min_size=B, max_size=B))
    else:
        adv = draw(st.lists(advs, min_size=B, max_size=B))
    w = draw(st.lists(st.floats(0.1, 3.0), min_size=B, max_size=B))
    return logp, old, mask, adv, w


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


# ---- aggregate ----

L_HAND = [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
M_HAND = [[1, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    ("agg", "w", "expected"),
    [
        ("token-mean", None, 10 / 4),
        ("seq-mean-token-sum", None, (6 + 4) / 2),
        ("seq-mean-token-mean", None, (2 + 4) / 2),
        ("seq-mean-token-sum-norm", None, (6 / 3 + 4 / 3) / 2),
        ("token-mean", [1.0, 3.0], (6 + 3 * 4) / (3 + 3)),
        ("seq-mean-token-sum", [1.0, 3.0], (6 + 3 * 4) / 4),
        ("seq-mean-token-mean", [1.0, 3.0], (2 + 3 * 4) / 4),
    ],
)
def test_aggregate_hand_computed(agg, w, expected):
    w = None if w is None else t64(w)
    assert aggregate(t64(L_HAND), torch.tensor(M_HAND), agg, w).item() == pytest.approx(expected)


@pytest.mark.parametrize("agg", AGGS)
def test_aggregate_empty_rows_and_batches(agg):
    loss_mat = t64([[1.0, 2.0], [float("nan"), float("inf")]]).requires_grad_()
    mask = torch.tensor([[1, 1], [0, 0]])
    # the empty row neither counts in a seq-mean nor leaks its nan
    expected = ref_aggregate([[1.0, 2.0], [0.0, 0.0]], [[1, 1], [0, 0]], agg)
    out = aggregate(loss_mat, mask, agg)
    assert out.item() == pytest.approx(expected)
    out.backward()
    assert loss_mat.grad[1].eq(0).all()

    empty = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    out = aggregate(empty, torch.zeros(2, 3), agg)
    out.backward()
    assert out.item() == 0.0 and empty.grad.eq(0).all()


def test_aggregate_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown agg 'mean'"):
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must both be \\(B, T\\)"):
        aggregate(torch.zeros(1, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="seq_weights must have shape \\(1,\\)"):
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), seq_weights=torch.ones(2))


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.booleans())
def test_aggregate_matches_reference(batch, agg, weighted):
    loss_mat, _, mask, _, w = batch
    w = w if weighted else None
    got = aggregate(t64(loss_mat), torch.tensor(mask), agg, None if w is None else t64(w))
    assert got.item() == pytest.approx(ref_aggregate(loss_mat, mask, agg, w), abs=1e-6)


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.floats(0.1, 5.0))
def test_equal_weights_equal_no_weights(batch, agg, c):
    loss_mat, _, mask, _, _ = batch
    L, m = t64(loss_mat), torch.tensor(mask)
    weighted = aggregate(L, m, agg, torch.full((L.shape[0],), c, dtype=torch.float64))
    assert weighted.item() == pytest.approx(aggregate(L, m, agg).item(), abs=1e-12)


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.data())
def test_doubling_a_weight_equals_duplicating_the_row(batch, agg, data):
    logp, old, mask, adv, w = batch
    i = data.draw(st.integers(0, len(logp) - 1))
    doubled = list(w)
    doubled[i] *= 2
    dup = lambda rows: rows + [rows[i]]  # noqa: E731
    a, _ = ppo_policy_loss(t64(logp), t64(old), t64(adv), torch.tensor(mask), agg=agg,
                           seq_weights=t64(doubled))
    b, _ = ppo_policy_loss(t64(dup(logp)), t64(dup(old)), t64(dup(adv)), torch.tensor(dup(mask)),
                           agg=agg, seq_weights=t64(dup(w)))
    assert a.item() == pytest.approx(b.item(), abs=1e-9)


@pytest.mark.parametrize(("agg", "expected"), [
    ("token-mean", [0.5 * 3, 2.0 * 0, 1.0 * 1]),
    ("seq-mean-token-mean", [0.5, 0.0, 1.0]),
    ("seq-mean-token-sum", [0.5, 0.0, 1.0]),
    ("seq-mean-token-sum-norm", [0.5, 0.0, 1.0]),
])
def test_sequence_mass_hand_computed(agg, expected):
    weights, trained = np.array([0.5, 2.0, 1.0]), np.array([3, 0, 1])
    assert sequence_mass(weights, trained, agg).tolist() == expected
    assert [float(sequence_mass(w, n, agg)) for w, n in zip(weights, trained)] == expected
    with pytest.raises(ValueError, match="unknown agg"):
        sequence_mass(weights, trained, "mean")


def test_micro_batch_shares_hand_computed():
    assert micro_batch_share(1.0, 4.0, "token-mean", 3, 6) == 0.25
    assert micro_batch_share(1.0, 4.0, "seq-mean-token-sum-norm", 3, 6) == 0.125  # 1/4 * 3/6
    assert micro_batch_share(1.0, 0.0, "seq-mean-token-mean") == 0.0  # nothing trains
    assert token_share(3.0, 12.0) == 0.25 and token_share(0.0, 0.0) == 0.0


@pytest.mark.parametrize("agg", AGGS)
def test_micro_batch_losses_scaled_by_their_shares_add_up_to_the_batch_loss(agg):
    """Rows 0-1 padded to 3 tokens, row 2 to 5: the two micro-batches' losses, each aggregated
    alone and scaled by its share, give the whole (5-token padded) batch's loss."""
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [4.0, 5.0, 0.0, 0.0, 0.0],
                         [6.0, 7.0, 8.0, 9.0, 1.0]])  # fmt: skip
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    w = torch.tensor([0.5, 1.0, 2.0])
    mass = sequence_mass(w.numpy(), mask.sum(-1).numpy(), agg)
    parts = [(slice(0, 2), 3), (slice(2, 3), 5)]
    total = sum(
        micro_batch_share(float(mass[rows].sum()), float(mass.sum()), agg, T, 5)
        * aggregate(loss[rows, :T], mask[rows, :T], agg, w[rows])
        for rows, T in parts
    )
    assert float(total) == pytest.approx(float(aggregate(loss, mask, agg, w)), rel=1e-6)


def test_loss_shares_sum_to_one_or_are_all_zero():
    assert loss_shares({"a": 1.5, "b": 0.0, "c": 0.5}) == {"a": 0.75, "b": 0.0, "c": 0.25}
    assert loss_shares({"a": 0.0}) == {"a": 0.0}


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.data())
def test_micro_batches_scaled_by_mass_share_add_up_to_the_batch(batch, agg, data):
    """The trainer's gradient accumulation: any split, each part's aggregate times its share
    of the batch's `sequence_mass`, sums to the whole batch's aggregate (same padded T)."""
    loss_mat, _, mask, _, w = batch
    L, m, weights = t64(loss_mat), torch.tensor(mask), t64(w)
    cut = data.draw(st.integers(1, len(loss_mat)))
    parts = [slice(0, cut), slice(cut, len(loss_mat))]
    total_mass = float(sequence_mass(weights.numpy(), m.sum(-1).numpy(), agg).sum())
    summed = 0.0
    for part in parts:
        if L[part].shape[0] == 0 or total_mass == 0:
            continue
        mass = float(sequence_mass(weights[part].numpy(), m[part].sum(-1).numpy(), agg).sum())
        summed += aggregate(L[part], m[part], agg, weights[part]).item() * mass / total_mass
    assert summed == pytest.approx(aggregate(L, m, agg, weights).item(), abs=1e-9)


# ---- ppo_policy_loss ----

LOGP_OLD = [[0.0, 0.0, 0.0]]
LOGP = [[math.log(1.5), math.log(0.5), 0.0]]  # ratios 1.5 (above 1.28), 0.5 (below 0.8), 1.0


def test_ppo_hand_computed_positive_advantage():
    logp = t64(LOGP).requires_grad_()
    loss, metrics = ppo_policy_loss(logp, t64(LOGP_OLD), t64([1.0]), torch.ones(1, 3))
    # max(-r, -clip(r)): -1.28 (clipped), -0.5 (unclipped), -1.0
    assert loss.item() == pytest.approx((-1.28 - 0.5 - 1.0) / 3)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    k3 = [(r - 1 - math.log(r)) for r in (1.5, 0.5, 1.0)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 3)
    assert "dual_clip_frac" not in metrics and "entropy" not in metrics
    loss.backward()
    # d(-adv * ratio)/dlogp = -ratio on unclipped tokens, 0 where the clip won
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 3, -1.0 / 3])


def test_ppo_hand_computed_negative_advantage_dual_clip():
    loss, metrics = ppo_policy_loss(t64(LOGP), t64(LOGP_OLD), t64([-1.0]), torch.ones(1, 3))
    # max(r, clip(r)): 1.5, 0.8 (clipped), 1.0
    assert loss.item() == pytest.approx((1.5 + 0.8 + 1.0) / 3)
    logp = t64(LOGP).requires_grad_()
    loss, metrics = ppo_policy_loss(logp, t64(LOGP_OLD), t64([-1.0]), torch.ones(1, 3), clip_c=1.4)
    # dual clip caps 1.5 at -adv * clip_c = 1.4
    assert loss.item() == pytest.approx((1.4 + 0.8 + 1.0) / 3)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.0 / 3])


def test_ppo_entropy_metric_is_masked_mean():
    entropy = t64([[1.0, 2.0, 30.0]])
    _, metrics = ppo_policy_loss(t64(LOGP), t64(LOGP_OLD), t64([1.0]), torch.tensor([[1, 1, 0]]),
                                 entropy=entropy)
    assert metrics["entropy"] == pytest.approx(1.5)


def test_ppo_rejects_bad_input():
    args = (t64(LOGP), t64(LOGP_OLD), t64([1.0]), torch.ones(1, 3))
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        ppo_policy_loss(*args, clip_c=1.0)
    with pytest.raises(ValueError, match="same \\(B, T\\) shape"):
        ppo_policy_loss(t64(LOGP), t64([[0.0, 0.0]]), t64([1.0]), torch.ones(1, 3))
    with pytest.raises(ValueError, match="must be \\(B, T\\) or \\(B,\\)"):
        ppo_policy_loss(t64(LOGP), t64(LOGP_OLD), t64([1.0, 1.0, 1.0]), torch.ones(1, 3))


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.sampled_from([None, 1.5, 3.0]), st.booleans())
def test_ppo_matches_reference(batch, agg, clip_c, weighted):
    logp, old, mask, adv, w = batch
    w = w if weighted else None
    loss, metrics = ppo_policy_loss(t64(logp), t64(old), t64(adv), torch.tensor(mask),
                                    clip_low=0.2, clip_high=0.28, clip_c=clip_c, agg=agg,
                                    seq_weights=None if w is None else t64(w))
    ref = ref_aggregate(ref_pg_matrix(logp, old, adv, 0.2, 0.28, clip_c), mask, agg, w)
    assert loss.item() == pytest.approx(ref, abs=1e-6)
    ratios = [[math.exp(a - b) for a, b in zip(r1, r2)] for r1, r2 in zip(logp, old)]
    ratio_mean = ref_aggregate(ratios, mask, "token-mean")
    assert metrics["ratio_mean"] == pytest.approx(ratio_mean, abs=1e-6)


@SETTINGS
@given(batches(), st.sampled_from(AGGS), st.sampled_from([None, 2.0]), st.booleans())
def test_mask_zero_tokens_get_zero_gradient(batch, agg, clip_c, garbage):
    logp_l, old_l, mask_l, adv, w = batch
    mask = torch.tensor(mask_l)
    logp, old = t64(logp_l), t64(old_l)
    if garbage:  # padding may hold anything: -inf logprobs, nan
        logp = torch.where(mask, logp, float("-inf"))
        old = torch.where(mask, old, float("nan"))
    logp.requires_grad_()
    loss, _ = ppo_policy_loss(logp, old, t64(adv), mask, clip_c=clip_c, agg=agg, seq_weights=t64(w))
    kl, _ = kl_loss(logp, torch.where(mask, t64(old_l), float("nan")), mask, "k3", agg)
    (loss + kl).backward()
    assert torch.isfinite(loss) and torch.isfinite(kl)
    assert logp.grad[~mask].eq(0).all()
    assert torch.isfinite(logp.grad).all()


# ---- KL ----

def test_kl_penalty_hand_computed():
    logp, ref = t64([[math.log(0.5)]]), t64([[math.log(0.25)]])
    x = math.log(0.5)  # ref - logp
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-x)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * x * x)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - x - 1)
    with pytest.raises(ValueError, match="unknown KL kind 'k4'"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


@SETTINGS
@given(batches(), st.sampled_from(["k1", "k2", "k3"]), st.sampled_from(AGGS), st.booleans())
def test_kl_matches_reference(batch, kind, agg, weighted):
    logp, ref, mask, _, w = batch
    w = w if weighted else None
    per_token = kl_penalty(t64(logp), t64(ref), kind)
    expected = [[ref_kl(a, b, kind) for a, b in zip(r1, r2)] for r1, r2 in zip(logp, ref)]
    np.testing.assert_allclose(per_token.numpy(), np.array(expected), atol=1e-9)
    if kind == "k3":
        assert per_token.ge(0).all()
    loss, metrics = kl_loss(t64(logp), t64(ref), torch.tensor(mask), kind, agg,
                            None if w is None else t64(w))
    assert loss.item() == pytest.approx(ref_aggregate(expected, mask, agg, w), abs=1e-6)
    assert metrics["kl"] == pytest.approx(loss.item())


# ---- entropy ----

def ref_entropy(row):
    z = np.asarray(row, dtype=np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    return float(-sum(pi * math.log(pi) for pi in p if pi > 0))


def test_entropy_uniform_and_banned_tokens():
    H = entropy_from_logits(torch.zeros(2, 3, 8))
    assert H.shape == (2, 3) and H.flatten().tolist() == pytest.approx([math.log(8)] * 6)
    logits = torch.tensor([[[0.0, 0.0, float("-inf"), float("-inf")]]])
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(2))


def test_entropy_low_precision_is_upcast():
    out = entropy_from_logits(torch.zeros(1, 2, 16, dtype=torch.bfloat16))
    assert out.dtype == torch.float32 and out[0].tolist() == pytest.approx([math.log(16)] * 2)


@SETTINGS
@given(
    st.integers(1, 3), st.integers(1, 4), st.integers(2, 6), st.integers(1, 5),
    st.randoms(use_true_random=False),
)
def test_entropy_matches_reference_and_gradient(B, T, V, chunk, rnd):
    rows = [[rnd.uniform(-5, 5) for _ in range(V)] for _ in range(B * T)]
    logits = t64(rows).reshape(B, T, V).requires_grad_()
    H = entropy_from_logits(logits, chunk_size=chunk)
    assert H.shape == (B, T)
    expected = [ref_entropy(r) for r in rows]
    np.testing.assert_allclose(H.detach().flatten().numpy(), expected, atol=1e-9)
    H.sum().backward()
    ref_logits = logits.detach().clone().requires_grad_()
    torch.distributions.Categorical(logits=ref_logits).entropy().sum().backward()
    np.testing.assert_allclose(logits.grad.numpy(), ref_logits.grad.numpy(), atol=1e-9)


# ---- config and public surface ----

def test_policy_loss_config():
    cfg = PolicyLossConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.clip_c, cfg.agg) == (0.2, 0.28, None, "token-mean")
    assert (cfg.kl_coef, cfg.kl_kind, cfg.entropy_coef) == (0.0, "k3", 0.0)
    assert cfg.advantage_estimator == "grpo"
    assert PolicyLossConfig(clip_c=3.0).clip_c == 3.0
    with pytest.raises(ValidationError, match="clip_c"):
        PolicyLossConfig(clip_c=1.0)
    with pytest.raises(ValidationError, match="agg"):
        PolicyLossConfig(agg="mean")
    with pytest.raises(ValidationError, match="clip_lo"):
        PolicyLossConfig(clip_lo=0.1)
    assert all(f.description for f in PolicyLossConfig.model_fields.values())


def test_public_api_is_documented():
    assert sorted(algorithms.__all__) == sorted(set(algorithms.__all__))
    for name in algorithms.__all__:
        obj = getattr(algorithms, name)
        if callable(obj) and not name[0].isupper() or isinstance(obj, type):
            assert obj.__doc__, name
