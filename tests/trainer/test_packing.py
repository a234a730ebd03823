"""Packing: hand-built samples to exact padded tensors; micro-batches and shards within budget."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from agentrl_sdk.trainer.packing import (
    FlatSamples,
    micro_batches,
    mini_batches,
    pack,
    shard_plan,
)
from agentrl_sdk.types import Sample


def _sample(prompt, response, mask, old, adv=0.0, weight=1.0) -> Sample:
    return Sample(
        row_id="r", sample_index=0, prompt_ids=prompt, response_ids=response,
        response_mask=mask, old_logprobs=old, token_advantages=[adv] * len(response),
        weight=weight,
    )  # fmt: skip


@pytest.fixture
def flat() -> FlatSamples:
    return FlatSamples.from_samples([
        _sample([5, 6, 7], [8, 9], [1, 0], [-0.5, 0.0], adv=1.0),
        _sample([1], [2, 3, 4], [1, 1, 1], [-1.0, -2.0, -3.0], adv=-0.5, weight=0.5),
    ])  # fmt: skip


def test_flat_samples_round_trip(flat):
    assert flat.prompt_lengths.tolist() == [3, 1]
    assert flat.response_lengths.tolist() == [2, 3]
    assert flat.lengths.tolist() == [5, 4]
    assert flat.trained_tokens.tolist() == [1, 3]
    assert flat.response_ids[flat.response_slice(1)].tolist() == [2, 3, 4]


def test_pack_two_samples_exact(flat):
    b = pack(flat, [0, 1], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Shortest prompt is 1 token: logits are kept from position 0, so L - 0 = 5 of them.
    assert b.num_logits == 5
    # Response token j of a row with prompt P is predicted at position P - 1 + j.
    assert b.logit_index.tolist() == [[2, 3, 0], [0, 1, 2]]
    assert b.response_ids.tolist() == [[8, 9, 0], [2, 3, 4]]
    assert b.response_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert b.old_logprobs.tolist() == [[-0.5, 0.0, 0.0], [-1.0, -2.0, -3.0]]
    # A sample's one advantage is broadcast over its response tokens; padding holds 0.
    assert b.advantages.tolist() == [[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]]
    assert b.values is None and b.returns is None
    assert b.weights.tolist() == [1.0, 0.5]
    assert b.input_ids.dtype == torch.long and b.response_mask.dtype == torch.float32


def test_pack_token_advantages_values_and_returns():
    samples = [
        _sample([5, 6], [8, 9], [1, 0], [-0.5, 0.0]).model_copy(update={
            "token_advantages": [0.3, 0.0], "values": [0.1, 0.2], "returns": [0.4, 0.0]}),
        _sample([1], [2, 3, 4], [1, 1, 1], [-1.0, -2.0, -3.0]).model_copy(update={
            "token_advantages": [1.0, 2.0, 3.0], "values": [0.5, 0.6, 0.7],
            "returns": [1.5, 2.6, 3.7]}),
    ]  # fmt: skip
    flat = FlatSamples.from_samples(samples)
    assert len(flat) == 2 and flat.advantages.tolist() == pytest.approx([0.3, 0, 1, 2, 3])
    b = pack(flat, [1, 0])
    assert b.advantages.tolist() == [pytest.approx([1.0, 2.0, 3.0]), pytest.approx([0.3, 0, 0])]
    assert b.values.tolist() == [pytest.approx([0.5, 0.6, 0.7]), pytest.approx([0.1, 0.2, 0])]
    assert b.returns.tolist() == [pytest.approx([1.5, 2.6, 3.7]), pytest.approx([0.4, 0, 0])]


def test_pack_keeps_only_needed_logits(flat):
    b = pack(flat, [0], pad_id=3)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    # Positions 2..4 are kept; token 8 (position 3) is predicted by position 2 = kept index 0.
    assert b.num_logits == 3
    assert b.logit_index.tolist() == [[0, 1]]


def test_pack_selects_rows_in_order(flat):
    b = pack(flat, [1, 0], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 0], [5, 6, 7, 8, 9]]
    assert b.logit_index.tolist() == [[0, 1, 2], [2, 3, 0]]


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty prompt_ids"):
        FlatSamples.from_samples([_sample([], [1], [1], [0.0])])


def test_micro_batches_exact_and_within_budget():
    lengths = [5, 4, 10, 3, 3, 7]
    # Longest first: 10 alone (2 * 10 > 12), 7 alone (2 * 7 > 12), then 5 + 4, then 3 + 3.
    assert micro_batches(lengths, range(6), 12) == [[2], [5], [0, 1], [3, 4]]
    assert micro_batches(lengths, range(6), 100) == [[2, 5, 0, 1, 3, 4]]
    # A sample over the budget runs alone rather than failing the step.
    assert micro_batches(lengths, [2, 3], 8) == [[2], [3]]


def test_micro_batches_and_shards_random():
    rng = random.Random(0)
    for _ in range(200):
        n, world, budget = rng.randint(1, 30), rng.randint(1, 4), rng.randint(4, 80)
        lengths = [rng.randint(1, 40) for _ in range(n)]
        plan = shard_plan(lengths, range(n), world, budget)
        assert len(plan) == world and len({len(p) for p in plan}) == 1
        seen = sorted(i for rank in plan for mb in rank for i in mb)
        assert seen == list(range(n))
        for mb in (mb for rank in plan for mb in rank):
            if len(mb) > 1:
                assert len(mb) * max(lengths[i] for i in mb) <= budget
        loads = [sum(lengths[i] for mb in rank for i in mb) for rank in plan]
        assert max(loads) - min(loads) <= max(lengths)


def test_mini_batches():
    assert mini_batches(5, 2) == [[0, 1, 2], [3, 4]]
    with pytest.raises(ValueError, match="num_mini_batches=3"):
        mini_batches(2, 3)


def test_flat_samples_ship_as_numpy(flat):
    assert all(isinstance(v, np.ndarray) for v in vars(flat).values() if v is not None)
    with pytest.raises(ValueError, match="shape"):
        flat.with_old_logprobs(np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        flat.with_token_weights(np.zeros(2, dtype=np.float32))


def test_token_weights_are_packed_like_old_logprobs(flat):
    weights = np.arange(len(flat.response_ids), dtype=np.float32) + 1.0
    packed = pack(flat.with_token_weights(weights), [1, 0])
    assert pack(flat, [1, 0]).token_weights is None
    for row, i in enumerate([1, 0]):
        span = flat.response_slice(i)
        r = span.stop - span.start
        assert packed.token_weights[row, :r].tolist() == weights[span].tolist()
        assert packed.token_weights[row, r:].eq(0).all()
