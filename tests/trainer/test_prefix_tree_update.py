"""``trainer.share_prefix``: an update whose micro-batches are laid out as prefix trees (a
group's prompt, and a rollout tree's trained trunk, run once) equals the single-process
reference over the unshared samples."""

from __future__ import annotations

import random

import pytest

from agentrl_sdk.trainer import TrainerGroup
from agentrl_sdk.trainer.packing import FlatSamples
from agentrl_sdk.trainer.prefix_tree import prefix_plan
from agentrl_sdk.types import Batch, Sample
from tests.trainer.test_in_process import IN_PROCESS
from tests.trainer.test_trainer_group import LOSS_C, Reference, full_state, max_diff

pytestmark = pytest.mark.slow

SHARED = IN_PROCESS.model_copy(update={"share_prefix": True, "micro_batch_tokens": 40})


def tree_batch(seed: int) -> Batch:
    """Two problems, each a tree: a trunk (a trained reply, then a tool's output) the leaves
    share, then each leaf's own trained reply; advantages differ by leaf."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1, 1000) for _ in range(n)]

    system, samples = ids(5), []
    for problem in range(2):
        prompt, trunk = system + ids(3), ids(4)
        for leaf in range(3):
            own = ids(rng.randint(1, 4))
            mask = [1, 1, 0, 0] + [1] * len(own)
            samples.append(Sample(
                row_id=f"{seed}-{problem}", sample_index=leaf, prompt_ids=prompt,
                response_ids=trunk + own, response_mask=mask,
                old_logprobs=[-rng.uniform(5.5, 8.5) for _ in mask],
                token_advantages=[rng.gauss(0.0, 1.0)] * len(mask),
            ))  # fmt: skip
    return Batch(samples=samples)


def test_prefix_tree_updates_equal_the_unshared_reference(model_path):
    batches = [tree_batch(seed) for seed in (1, 2)]
    flat = FlatSamples.from_samples(batches[0].samples)
    (plan,) = prefix_plan(flat, range(len(flat)), 1, SHARED.micro_batch_tokens)
    assert sum(len(b) for b in plan) == 6 and len(plan) < 6  # leaves share micro-batches
    reference = Reference(model_path, SHARED, LOSS_C)
    from agentrl_sdk.trainer.layers import freeze_all_but_last

    freeze_all_but_last(reference.model, reference.model.model.layers, 1)
    with TrainerGroup(model_path, SHARED, LOSS_C) as group:
        for batch in batches:
            got = group.update(batch)
            expected = reference.update(batch.samples)
            assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
            assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
            # Adam's first step moves a weight by lr * g / (|g| + eps): where g is ~1e-10, the
            # float rounding of another summation order shows as ~1e-5 (a trunk weighed once
            # instead of per leaf would move the others by ~lr = 1e-3).
            assert max_diff(full_state(group), reference.state_dict()) < 1e-4
