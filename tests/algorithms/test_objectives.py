"""The objectives as pure functions of model outputs and a batch: the PPO objective is the
clipped loss + kl_coef x KL - entropy_coef x entropy, with gradient through each term."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentrl_sdk.algorithms import PolicyLossConfig, ValueLossConfig, aggregate, ppo_policy_loss
from agentrl_sdk.algorithms.kl import kl_loss
from agentrl_sdk.algorithms.losses import entropy_from_logits
from agentrl_sdk.algorithms.objectives import (
    PolicyOutputs,
    policy_metric_shares,
    policy_objective,
    value_objective,
)


def _batch(**extra):
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    return SimpleNamespace(
        response_mask=mask, old_logprobs=torch.randn(2, 3) * 0.1 - 1.0,
        advantages=torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]),
        weights=torch.ones(2), token_weights=None, values=None, returns=None, **extra,
    )  # fmt: skip


def _outputs(reference: bool = False):
    logits = torch.randn(2, 3, 5, requires_grad=True)
    ids = torch.tensor([[1, 2, 0], [3, 0, 0]])
    logp = logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ref = (logp.detach() + 0.05) if reference else None
    return PolicyOutputs(logp, entropy_from_logits(logits), ref), logits


def test_the_policy_objective_composes_the_clipped_loss_kl_and_entropy():
    batch = _batch()
    config = PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01, agg="seq-mean-token-mean")
    outputs, logits = _outputs(reference=True)
    loss, metrics = policy_objective(outputs, batch, config)

    mask = batch.response_mask
    entropy = entropy_from_logits(logits)
    pg, _ = ppo_policy_loss(outputs.logprobs, batch.old_logprobs, batch.advantages, mask,
                            agg=config.agg, seq_weights=batch.weights, entropy=entropy.detach())
    kl, _ = kl_loss(outputs.logprobs, outputs.reference_logprobs, mask, "k3", config.agg,
                    batch.weights)
    expected = pg + 0.1 * kl - 0.01 * aggregate(entropy, mask, config.agg, batch.weights)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-7)
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-7)
    assert set(policy_metric_shares(config).by_loss) == {"loss", "pg_loss", "kl"} <= set(metrics)
    loss.backward()  # the entropy term carries gradient to the logits
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_without_kl_or_entropy_terms_it_is_the_clipped_loss():
    batch = _batch()
    config = PolicyLossConfig()
    outputs, _ = _outputs()
    loss, metrics = policy_objective(outputs, batch, config)
    pg, _ = ppo_policy_loss(outputs.logprobs, batch.old_logprobs, batch.advantages,
                            batch.response_mask, seq_weights=batch.weights)
    assert loss.item() == pytest.approx(pg.item(), abs=1e-7) and "kl" not in metrics
    assert "dual_clip_frac" not in policy_metric_shares(config).by_token
    assert "dual_clip_frac" in policy_metric_shares(PolicyLossConfig(clip_c=3.0)).by_token


def test_a_kl_term_without_reference_logprobs_and_a_value_batch_without_returns_are_refused():
    with pytest.raises(ValueError, match="reference"):
        policy_objective(_outputs()[0], _batch(), PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="values and returns"):
        value_objective(torch.zeros(2, 3), _batch(), ValueLossConfig())
