"""RL math as pure functions of tensors: advantages, policy and KL losses, aggregation, and
off-policy corrections."""

from agentrl_sdk.algorithms.advantages import (
    AdvantageEstimator,
    compute_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
)
from agentrl_sdk.algorithms.aggregation import LossAgg, aggregate, loss_shares, sequence_mass
from agentrl_sdk.algorithms.corrections import OffPolicyCorrection, importance_weights
from agentrl_sdk.algorithms.kl import KLKind, kl_loss, kl_penalty
from agentrl_sdk.algorithms.losses import PolicyLossConfig, entropy_from_logits, ppo_policy_loss

__all__ = [
    "AdvantageEstimator",
    "KLKind",
    "LossAgg",
    "OffPolicyCorrection",
    "PolicyLossConfig",
    "aggregate",
    "compute_advantages",
    "compute_grpo_advantages",
    "compute_rloo_advantages",
    "entropy_from_logits",
    "importance_weights",
    "kl_loss",
    "kl_penalty",
    "loss_shares",
    "ppo_policy_loss",
    "sequence_mass",
]
