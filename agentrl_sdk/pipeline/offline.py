"""Policy updates on token sequences recorded elsewhere (production traces): no rollouts, the
recorded ids trained as they are, weighted by importance correction."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_sdk.pipeline.batch import advantages
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.policies import model_path, trainer_options
from agentrl_sdk.trainer import TrainerGroup
from agentrl_sdk.types import Batch, Sample

__all__ = ["OfflineResult", "train_on_samples"]

logger = logging.getLogger(__name__)

DEFAULT_IS_CAP = 2.0
"""Truncation of the importance weights when the config asks for no correction."""


@dataclass
class OfflineResult:
    """What `train_on_samples` trained and wrote.

    Attributes:
        samples: The trained samples, in order, with their advantages: ids and behaviour
            logprobs exactly as given.
        updates: Each update's trainer metrics (``loss``, ``is_weight_mean`` ...).
        final_model: The trained policy's ``save_pretrained`` folder (None without an
            ``output_dir``).
        metrics: The estimator's metrics over all samples.
    """

    samples: list[Sample]
    updates: list[dict[str, float]] = field(default_factory=list)
    final_model: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def train_on_samples(
    samples: Sequence[Sample],
    config: TrainConfig,
    *,
    extra: Mapping[str, object] | None = None,
    epochs: int = 1,
    samples_per_update: int | None = None,
    output_dir: str | Path | None = None,
) -> OfflineResult:
    """Updates ``config.model`` on ``samples`` (recorded ids and behaviour logprobs, zero
    advantages) and writes the result.

    Advantages come from ``config.algorithm``'s estimator over the samples' ``row_id`` groups,
    once, before the first update. Every update weighs each token's loss by the importance
    weight ``pi_trainer / pi_behaviour`` (``algorithm.correction``; ``tis`` truncated at
    `DEFAULT_IS_CAP` when the config says ``none``: recorded tokens are always off-policy).
    The trainer's temperature is ``rollout.sampling.temperature``: set it to the one the
    samples were drawn at, or the weights compare two different distributions.

    Args:
        samples: What to train on (`agentrl_sdk.production.training_batch`).
        config: The model, trainer and algorithm (rollout and data sections are not used).
        extra: The `Sequences` fields the samples come with (per-call step rewards).
        epochs: Passes over the samples.
        samples_per_update: Samples per update (all of them when None).
        output_dir: Where ``final_model`` is written.

    Raises:
        ValueError: No samples, or an estimator that needs a critic's values.
    """
    if not samples:
        raise ValueError("no samples to train on (is the trace selection empty?)")
    estimator = config.algorithm.estimator
    if estimator.needs_values:
        raise ValueError(
            f"algorithm.advantage_estimator {config.algorithm.advantage_estimator!r} needs a "
            "critic's values, which recorded samples do not have: use grpo, rloo or reinforce"
        )
    trained, metrics = advantages(list(samples), extra or {}, estimator)
    loss = config.algorithm.loss
    if loss.correction == "none":
        loss = loss.model_copy(update={"correction": "tis", "is_cap": loss.is_cap or DEFAULT_IS_CAP})
    per_update = samples_per_update or len(trained)
    result = OfflineResult(trained, metrics=metrics)
    with TrainerGroup(model_path(config.model), trainer_options(config), loss) as group:
        for _ in range(epochs):
            for start in range(0, len(trained), per_update):
                batch = Batch(step=len(result.updates), samples=trained[start:start + per_update])
                result.updates.append(group.update(batch))
                logger.info("offline update %d: loss %.4f", batch.step,
                            result.updates[-1].get("loss", float("nan")))
        if output_dir is not None:
            result.final_model = str(group.export_pretrained(Path(output_dir) / "final_model"))
    return result
