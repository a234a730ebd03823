"""RL math as pure functions of tensors: advantage estimators (one registry), policy, value
and KL losses, aggregation, and off-policy corrections."""

from agentrl_sdk.algorithms.advantages import (
    AdvantageEstimator,
    compute_grpo_advantages,
    compute_rloo_advantages,
)
from agentrl_sdk.algorithms.aggregation import (
    LossAgg,
    aggregate,
    loss_shares,
    micro_batch_share,
    sequence_mass,
    token_share,
)
from agentrl_sdk.algorithms.corrections import OffPolicyCorrection, importance_weights
from agentrl_sdk.algorithms.estimators import (
    ESTIMATORS,
    Estimator,
    EstimatorName,
    Sequences,
    estimator_options,
    make_estimator,
)
from agentrl_sdk.algorithms.kl import KLKind, kl_loss, kl_penalty
from agentrl_sdk.algorithms.losses import PolicyLossConfig, entropy_from_logits, ppo_policy_loss
from agentrl_sdk.algorithms.value import (
    ValueLossConfig,
    compute_gae,
    explained_variance,
    masked_whiten,
    value_loss,
)

__all__ = [
    "ESTIMATORS",
    "AdvantageEstimator",
    "Estimator",
    "EstimatorName",
    "KLKind",
    "LossAgg",
    "OffPolicyCorrection",
    "PolicyLossConfig",
    "Sequences",
    "ValueLossConfig",
    "aggregate",
    "compute_gae",
    "compute_grpo_advantages",
    "compute_rloo_advantages",
    "entropy_from_logits",
    "estimator_options",
    "explained_variance",
    "importance_weights",
    "kl_loss",
    "kl_penalty",
    "loss_shares",
    "make_estimator",
    "micro_batch_share",
    "masked_whiten",
    "ppo_policy_loss",
    "sequence_mass",
    "token_share",
    "value_loss",
]
