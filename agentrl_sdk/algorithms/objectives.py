"""What a trainer rank minimises on one micro-batch, as pure functions ``(model outputs, batch)
-> (loss, metrics)``: the policy's PPO objective and the critic's value objective.

The trainer runs the model and scales each micro-batch's loss by its share of the step's
(`micro_batch_share`); which metrics add up by loss share and which by token share is said
here, beside the loss that makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from agentrl_sdk.algorithms.aggregation import aggregate
from agentrl_sdk.algorithms.kl import kl_loss
from agentrl_sdk.algorithms.losses import PolicyLossConfig, ppo_policy_loss
from agentrl_sdk.algorithms.value import ValueLossConfig, value_loss

__all__ = [
    "VALUE_METRIC_SHARES",
    "MetricShares",
    "ObjectiveBatch",
    "PolicyOutputs",
    "inert_without_signal",
    "policy_metric_shares",
    "policy_objective",
    "value_objective",
]


class ObjectiveBatch(Protocol):
    """The tensors of a packed micro-batch an objective reads, each ``(B, T)`` but ``weights``
    ``(B,)``; 0 at padding."""

    response_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    weights: Tensor
    token_weights: Tensor | None
    values: Tensor | None
    returns: Tensor | None


@dataclass(frozen=True)
class PolicyOutputs:
    """The policy model's outputs on a micro-batch.

    Args:
        logprobs: ``(B, T)`` response-token logprobs at the sampling temperature.
        entropy: ``(B, T)`` the entropies of the distributions they come from (with gradient
            when the objective has an entropy term).
        reference_logprobs: ``(B, T)`` the frozen reference's (only with a KL term).
    """

    logprobs: Tensor
    entropy: Tensor
    reference_logprobs: Tensor | None = None


@dataclass(frozen=True)
class MetricShares:
    """How an objective's metrics add up over a step's micro-batches: ``by_loss`` (parts of
    the loss) with each micro-batch's loss share, ``by_token`` (plain token means) with its
    share of trained tokens."""

    by_loss: tuple[str, ...]
    by_token: tuple[str, ...] = ()


def policy_metric_shares(config: PolicyLossConfig) -> MetricShares:
    """The metrics `policy_objective` reports under ``config``, by how they add up."""
    by_token = ("clip_frac", "approx_kl", "ratio_mean", "entropy")
    if config.clip_c is not None:
        by_token += ("dual_clip_frac",)
    by_loss = ("loss", "pg_loss", "kl") if config.kl_coef > 0 else ("loss", "pg_loss")
    return MetricShares(by_loss, by_token)


def inert_without_signal(config: PolicyLossConfig) -> bool:
    """Whether a sample none of whose trained tokens has an advantage adds nothing to
    `policy_objective`'s loss or gradient under ``config``: its clipped term is the advantage
    times a ratio, and no KL or entropy term reaches it. The trainer then leaves such samples
    (a GRPO group whose rewards agree) out of its forward and backward passes."""
    return config.kl_coef == 0 and config.entropy_coef == 0


def policy_objective(
    outputs: PolicyOutputs, batch: ObjectiveBatch, config: PolicyLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped loss (`ppo_policy_loss`), + ``kl_coef`` x KL to the reference,
    - ``entropy_coef`` x entropy, each aggregated with ``config.agg``."""
    mask, weights, entropy = batch.response_mask, batch.weights, outputs.entropy
    loss, metrics = ppo_policy_loss(
        outputs.logprobs, batch.old_logprobs, batch.advantages, mask,
        clip_low=config.clip_low, clip_high=config.clip_high, clip_c=config.clip_c,
        agg=config.agg, seq_weights=weights, entropy=entropy.detach(),
        token_weights=batch.token_weights,
    )  # fmt: skip
    if config.kl_coef > 0:
        if outputs.reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's logprobs")
        kl, kl_metrics = kl_loss(
            outputs.logprobs, outputs.reference_logprobs, mask, config.kl_kind, config.agg,
            weights,
        )  # fmt: skip
        loss = loss + config.kl_coef * kl
        metrics["kl"] = kl_metrics["kl"]
    if config.entropy_coef > 0:
        loss = loss - config.entropy_coef * aggregate(entropy, mask, config.agg, weights)
    return loss, metrics | {"loss": loss.item()}


VALUE_METRIC_SHARES = MetricShares(("value_loss",), ("clip_fraction", "values_mean"))
"""How `value_objective`'s metrics add up."""


def value_objective(
    values: Tensor, batch: ObjectiveBatch, config: ValueLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """The critic's clipped value loss of its ``(B, T)`` ``values`` against the batch's
    returns, clipped around the values the batch was scored with."""
    if batch.values is None or batch.returns is None:
        raise ValueError("a critic update needs samples with values and returns (GAE)")
    return value_loss(
        values, batch.values, batch.returns, batch.response_mask, config.cliprange_value,
        config.agg, batch.weights,
    )  # fmt: skip
