"""Prefix-tree packing: hand-built samples to the exact row `pack_shared` lays out, and
`prefix_plan`'s micro-batches, which lay out what neighbours share once, within budget."""

from __future__ import annotations

import random

from agentrl_sdk.trainer.packing import FlatSamples
from agentrl_sdk.trainer.prefix_tree import pack_shared, prefix_plan
from tests.trainer.test_packing import _sample


def test_pack_shared_lays_the_common_prefix_once_then_each_sample():
    flat = FlatSamples.from_samples([
        _sample([5, 6, 7], [8, 9], [1, 0], [-0.5, 0.0], adv=1.0),
        _sample([5, 6, 2, 3], [4], [1], [-1.0], adv=-0.5, weight=0.5),
    ])  # fmt: skip
    b = pack_shared(flat, [0, 1], pad_id=0)
    # Prefix [5, 6] once; then [7 | 8, 9] and [2, 3 | 4]: no padding.
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 2, 3, 4]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 4]]
    seen = b.attention_mask[0, 0].int().tolist()
    assert seen[4] == [1, 1, 1, 1, 1, 0, 0, 0]  # 9 sees the prefix and its own sample
    assert seen[7] == [1, 1, 0, 0, 0, 1, 1, 1]  # 4 sees the prefix and its own sample only
    assert b.num_logits == 6 and b.logit_rows.tolist() == [0, 0]
    # 8 is predicted by 7 (kept position 0), 9 by 8; 4 by 3 (kept position 4).
    assert b.logit_index.tolist() == [[0, 1], [4, 0]]
    assert b.response_ids.tolist() == [[8, 9], [4, 0]]
    assert b.advantages.tolist() == [[1.0, 1.0], [-0.5, 0.0]]
    assert b.weights.tolist() == [1.0, 0.5]


def test_pack_shared_lays_a_prefix_tree_with_shared_response_tokens():
    flat = FlatSamples.from_samples([
        _sample([5, 6], [7, 8, 9], [1, 0, 1], [-0.5, 0.0, -1.0]),
        _sample([5, 6], [7, 8, 4, 3], [1, 0, 1, 1], [-0.5, 0.0, -2.0, -3.0]),
        _sample([5, 6], [7, 8, 4, 3], [1, 0, 1, 1], [-0.5, 0.0, -2.0, -3.0]),
        _sample([5, 2], [1], [1], [-0.1]),
    ])  # fmt: skip
    b = pack_shared(flat, [0, 1, 2, 3])
    # [5, 6 | 7, 8] once (a reply and an observation), then [9]; [4, 3] after the shared 8;
    # the third sample equals the second and adds nothing; [2 | 1] after the shared 5.
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 2, 1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 4, 5, 1, 2]]
    seen = b.attention_mask[0, 0].int().tolist()
    assert seen[6] == [1, 1, 1, 1, 0, 1, 1, 0, 0]  # 3 sees its own sample's tokens only
    assert seen[8] == [1, 0, 0, 0, 0, 0, 0, 1, 1]
    # 7 is predicted by 6 (kept position 0) for the first three samples, 8 by 7; 9 and 4 by
    # the shared 8, 3 by 4 (also the third sample's); 1 by 2 (kept position 6).
    assert b.num_logits == 8
    assert b.logit_index.tolist() == [[0, 1, 2, 0], [0, 1, 2, 4], [0, 1, 2, 4], [6, 0, 0, 0]]


def _laid_out(flat: FlatSamples, indices: list[int]) -> int:
    return int(pack_shared(flat, indices).input_ids.shape[1]) if indices else 0


def test_prefix_plan_puts_a_groups_samples_together_within_the_laid_out_budget():
    question = {q: [9, 9, 9, q, q] for q in (1, 2, 3)}  # a system prompt, then the question
    samples = [_sample(question[q], [q, k, k], [1, 1, 1], [0.0] * 3)
               for k in range(4) for q in (3, 1, 2)]  # fmt: skip (groups interleaved)
    flat = FlatSamples.from_samples(samples)
    (plan,) = prefix_plan(flat, range(len(samples)), world_size=1, micro_batch_tokens=14)
    # A group of 4 lays out 5 + 3 + 2 + 2 + 2 = 14 tokens, so one group per micro-batch.
    assert plan == [[1, 4, 7, 10], [2, 5, 8, 11], [0, 3, 6, 9]]
    assert [_laid_out(flat, b) for b in plan] == [14, 14, 14]
    (one,) = prefix_plan(flat, range(len(samples)), world_size=1, micro_batch_tokens=100)
    assert len(one) == 1 and _laid_out(flat, one[0]) == 3 + 3 * (2 + 3 + 2 + 2 + 2)


def test_prefix_plan_on_random_batches_stays_in_budget_and_covers_every_sample_once():
    rng = random.Random(0)
    for _ in range(30):
        samples = []
        for _ in range(rng.randint(1, 20)):
            prompt = [1, 2, 3][: rng.randint(1, 3)] + [rng.randint(1, 4) for _ in range(rng.randint(0, 4))]
            response = [rng.randint(1, 4) for _ in range(rng.randint(1, 6))]
            samples.append(_sample(prompt, response, [1] * len(response), [0.0] * len(response)))
        flat = FlatSamples.from_samples(samples)
        world, budget = rng.randint(1, 3), rng.randint(4, 30)
        plan = prefix_plan(flat, range(len(samples)), world, budget)
        assert len({len(p) for p in plan}) == 1  # as many micro-batches on every rank
        taken = sorted(i for p in plan for b in p for i in b)
        assert taken == list(range(len(samples)))
        for b in (b for p in plan for b in p if len(b) > 1):
            assert _laid_out(flat, b) <= budget
