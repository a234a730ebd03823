"""The estimator registry: each estimator's token advantages on hand-built batches, and the
names it knows."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import get_args

import pytest
import torch

from agentrl_sdk.algorithms import (
    ESTIMATORS,
    AdvantageEstimator,
    EstimatorName,
    Sequences,
    estimator_options,
    make_estimator,
)
from agentrl_sdk.algorithms.config import AlgorithmConfig
from agentrl_sdk.types import Sample

# Rollouts 0 and 1 (group "g", rewards 1 and 0), rollout 2 alone (group "h"). Rollout 0 has
# two sequences; the second has an observation token (mask 0) and is one token longer.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
SEQS = Sequences(
    rewards=torch.tensor([1.0, 1.0, 0.0, 5.0], dtype=torch.float64),
    rollout=torch.tensor([0, 0, 1, 2]),
    group_ids=["g", "g", "h"],
    mask=MASK,
)


def close(t: torch.Tensor, want: list) -> None:
    torch.testing.assert_close(t, torch.tensor(want, dtype=t.dtype), atol=1e-6, rtol=1e-6)


def test_the_config_choices_are_the_registry_names():
    choices = get_args(AlgorithmConfig.model_fields["advantage_estimator"].annotation)
    assert choices == get_args(EstimatorName) == ("grpo", "drgrpo", "rloo", "tree", "gae")
    # algorithm.step_level chooses the one per-call estimator; advantage_estimator the others.
    assert set(choices) | {"step"} == set(ESTIMATORS) and "step" not in choices
    assert set(get_args(AdvantageEstimator)) < set(ESTIMATORS)


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; choose one of "
                       r"\['drgrpo', 'gae', 'grpo', 'rloo', 'step', 'tree'\]"):
        make_estimator("ppo")


def test_only_gae_needs_values_and_only_step_reads_calls():
    assert [n for n in sorted(ESTIMATORS) if make_estimator(n).needs_values] == ["gae"]
    assert [n for n in sorted(ESTIMATORS) if make_estimator(n).per_call] == ["step"]


def test_an_option_an_estimator_does_not_take_is_refused_with_the_ones_it_takes():
    with pytest.raises(ValueError, match=r"'grpo' takes no option 'gamma', 'lam'; its options: "
                       r"none"):
        make_estimator("grpo", gamma=0.5, lam=0.9)
    with pytest.raises(ValueError, match=r"'tree' takes no option 'whiten'; its options: "
                       r"baseline, levels"):
        make_estimator("tree", whiten=False)
    with pytest.raises(ValueError, match=r"'rloo' takes no option 'baseline'"):
        make_estimator("rloo", baseline="grpo")  # the entry fixes its own
    assert make_estimator("gae", gamma=0.5, whiten=False).gamma == 0.5
    assert estimator_options("step") == ("baseline", "gamma", "omega", "eps")


@pytest.mark.parametrize(("name", "a"), [
    ("grpo", (1.0 - 0.5) / (math.sqrt(0.5) + 1e-6)),  # unbiased std of {1, 0}
    ("drgrpo", 0.5),
    ("rloo", 1.0),  # 1 - 0, the other rollout's mean
])  # fmt: skip
def test_group_estimators_put_the_rollouts_advantage_on_every_token(name, a):
    est = make_estimator(name)(SEQS)
    assert est.advantages.shape == (4, 3)
    close(est.advantages, [[a] * 3, [a] * 3, [-a] * 3, [0.0] * 3])
    assert est.metrics["adv_groups"] == 2.0 and est.returns is None


def test_step_estimator_credits_each_call_its_return():
    # Rollout 0: calls earn 0.5 then 1.0 (returns 1.5, 1.0); rollout 1 earns 0 (returns 0).
    seqs = Sequences(
        rewards=torch.tensor([1.5, 1.5, 0.0], dtype=torch.float64),
        rollout=torch.tensor([0, 0, 1]), group_ids=["g", "g"], mask=torch.ones(3, 2),
        step_rewards=torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64),
        anchor_ids=["a", "b", "a"],
    )  # fmt: skip
    # Dr.GRPO baseline: the mean rollout return 0.75.
    est = make_estimator("step", baseline="drgrpo")(seqs)
    close(est.advantages, [[0.75] * 2, [0.25] * 2, [-0.75] * 2])
    # GiGPO: episode +-0.75, plus the step group of anchor "a" (returns 1.5, 0): +-0.75.
    gigpo = make_estimator("step", baseline="drgrpo", omega=1.0)(seqs)
    close(gigpo.advantages[:, 0], [1.5, 0.75, -1.5])


def test_step_estimator_needs_step_rewards():
    with pytest.raises(ValueError, match="step_rewards"):
        make_estimator("step")(SEQS)


def test_gae_reads_the_critics_values():
    values = torch.tensor([[0.1, 0.2, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    est = make_estimator("gae", whiten=False)(replace(SEQS, values=values))
    # gamma = lambda = 1: the return is the sequence's reward at every sampled token.
    want_ret = [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]]
    close(est.returns, want_ret)
    close(est.advantages, [[0.9, 0.8, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 0.0], [4.0, 0.0, 0.0]])
    assert est.metrics["returns_mean"] == pytest.approx(9 / 7)  # over the 7 sampled tokens
    whitened = make_estimator("gae")(replace(SEQS, values=values))
    assert float(whitened.advantages[MASK.bool()].sum()) == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="critic's values"):
        make_estimator("gae")(SEQS)


def test_sequences_of_samples_number_rollouts_and_groups():
    def sample(row, i, policy, n, reward):
        return Sample(row_id=row, sample_index=i, policy=policy, prompt_ids=[1],
                      response_ids=[2] * n, response_mask=[1] * n, old_logprobs=[0.0] * n,
                      token_advantages=[0.0] * n, reward=reward)

    seqs = Sequences.of([sample("r", 0, "p", 2, 1.0), sample("r", 0, "p", 1, 1.0),
                         sample("r", 1, "p", 3, 0.0), sample("r", 0, "q", 1, 2.0)])
    assert seqs.rollout.tolist() == [0, 0, 1, 2]
    assert list(seqs.group_ids) == [("r", "p"), ("r", "p"), ("r", "q")]
    assert seqs.rewards[seqs.first].tolist() == [1.0, 0.0, 2.0]  # one per rollout
    assert seqs.mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]


def test_a_samples_one_advantage_is_its_sampled_tokens_mean():
    def sample(adv, mask):
        n = len(mask)
        return Sample(row_id="r", sample_index=0, prompt_ids=[1], response_ids=[2] * n,
                      response_mask=mask, old_logprobs=[0.0] * n, token_advantages=adv)

    assert sample([0.1] * 3, [1, 1, 1]).advantage == 0.1  # exactly, not 0.1 * 3 / 3
    assert sample([0.9, 0.0, 0.7], [1, 0, 1]).advantage == pytest.approx(0.8)
    assert sample([0.3, 0.3], [0, 0]).advantage == 0.3
    assert sample([], []).advantage == 0.0
    with pytest.raises(ValueError, match="'token_advantages': 1"):
        sample([0.1], [1, 1])  # one advantage per response token
