"""The critic of PPO with a value model: `ValueWorker` ranks (the policy trainer's FSDP2 worker
with a value head and the clipped value loss) driven by a `CriticGroup`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentrl_sdk.algorithms import ValueLossConfig, value_loss
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.group import TrainerGroup
from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch
from agentrl_sdk.trainer.worker import PolicyWorker, _Normalisers
from agentrl_sdk.types import Batch

if TYPE_CHECKING:
    from torch import nn

__all__ = ["BackboneWithValueHead", "CriticGroup", "ValueWorker"]

_TOKEN_MEAN_METRICS = ("clip_fraction", "values_mean")


class ValueWorker(PolicyWorker):
    """One critic rank: the model folder's backbone with a ``Linear(hidden, 1)`` value head
    (transformers' ``AutoModelForTokenClassification`` with one label, as verl's critic),
    sharded, optimised and checkpointed exactly as the policy (`PolicyWorker`).

    The head starts at zero (every value 0), so the first advantages are the plain returns and
    every rank starts from the same weights. The value of response token ``t`` is the head's
    output at the position that predicts it: the state before the token is sampled.

    Args:
        rank: This worker's rank.
        world_size: Number of ranks.
        model_path: Local ``save_pretrained`` folder of the causal LM the critic starts from.
        config: Trainer options of the critic (its own lr, world size, ...).
        loss_config: The value loss options.
    """

    loss_config: ValueLossConfig  # type: ignore[assignment]

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        config: TrainerConfig,
        loss_config: ValueLossConfig,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if config.lora is not None:
            raise ValueError("the critic trains every weight of its model: no LoRA")
        # The rest (e.g. LoRA adapter names) as `PolicyWorker` takes it.
        super().__init__(rank, world_size, model_path, config, loss_config,  # type: ignore[arg-type]
                         *args, **kwargs)

    def _from_pretrained(self) -> nn.Module:
        from transformers import AutoConfig, AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        config = AutoConfig.from_pretrained(self.model_path, local_files_only=True, num_labels=1)
        config.classifier_dropout = 0.0
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the new head is "not initialized from the model"
        try:
            model = AutoModelForTokenClassification.from_pretrained(
                self.model_path, config=config, local_files_only=True, dtype=torch.float32
            )
        except ValueError:  # an architecture transformers has no token-classification class for
            model = BackboneWithValueHead.from_pretrained(self.model_path)
        finally:
            hf_logging.set_verbosity(verbosity)
        head = _value_head(model)
        with torch.no_grad():
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
        return model

    def _freeze(self, model: nn.Module, layers: Sequence[nn.Module]) -> None:
        super()._freeze(model, layers)
        _value_head(model).requires_grad_(True)  # the head always trains

    def _wants_reference(self) -> bool:
        return False

    def _metric_keys(self) -> list[str]:
        return ["value_loss", *_TOKEN_MEAN_METRICS]

    def _prepared(self, flat: FlatSamples) -> tuple[FlatSamples, dict[str, float]]:
        if flat.values is None or flat.returns is None:
            raise ValueError("a critic update needs samples with values and returns (GAE)")
        return flat, {}

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        """``(B, T)`` values of the states before each response token."""
        out = self.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        )
        scores = out.logits[..., 0].float()  # (B, L)
        # Kept logit k of `pack` is absolute position k + L - num_logits.
        offset = batch.input_ids.shape[1] - batch.num_logits
        rows = torch.arange(scores.shape[0], device=scores.device)[:, None]  # (B, 1)
        return scores[rows, batch.logit_index + offset]  # (B, T)

    @torch.no_grad()
    def compute_values(self, flat: FlatSamples) -> np.ndarray:
        """The critic's value of every response token (laid out like ``flat.response_ids``,
        0.0 at mask-0 positions); identical on every rank."""
        return self._per_token(flat, self._values)

    def _accumulate(
        self, flat: FlatSamples, indices: list[int], norm: _Normalisers, sums: dict[str, float]
    ) -> None:
        """Forward/backward of one micro-batch's value loss, scaled to its share of the step."""
        lc = self.loss_config
        batch = self._packed(flat, indices)
        mask = batch.response_mask
        share, token_share = self._shares(flat, indices, norm, mask)
        values = self._values(batch)
        assert batch.values is not None and batch.returns is not None  # see _prepared
        loss, metrics = value_loss(
            values, batch.values, batch.returns, mask, lc.cliprange_value, lc.agg, batch.weights
        )
        (loss * share).backward()
        sums["value_loss"] += metrics["value_loss"] * share
        for key in _TOKEN_MEAN_METRICS:
            sums[key] += metrics[key] * token_share


class BackboneWithValueHead(torch.nn.Module):
    """``AutoModel`` backbone + ``Linear(hidden, 1)`` on its last hidden states: the value model
    of an architecture without a ``...ForTokenClassification`` class in transformers.

    Args:
        backbone: The base model (``AutoModel``) of the policy's folder.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        self._no_split_modules = list(getattr(backbone, "_no_split_modules", None) or ())
        hidden = self.config.get_text_config().hidden_size
        self.score = torch.nn.Linear(hidden, 1)

    @classmethod
    def from_pretrained(cls, path: str) -> BackboneWithValueHead:
        """The backbone of the causal LM in ``path`` (float32) with a new head."""
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False
    ) -> SimpleNamespace:
        """``logits``: ``(B, L, 1)`` values, as a token-classification model returns them."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)
        return SimpleNamespace(logits=self.score(out.last_hidden_state))


def _value_head(model: nn.Module) -> torch.nn.Linear:
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"cannot find the value head of {type(model).__name__} (no Linear "
                         "'score' or 'classifier')")
    return head


class CriticGroup(TrainerGroup):
    """``world_size`` `ValueWorker` actors beside the policy's: the same start-up, lockstep
    calls, rank recovery (rebuild, last checkpoint, replayed updates) and checkpoints.

    Args:
        model_path: Local folder of the model the critic starts from (the policy's, or its own
            with the same tokenizer).
        trainer_config: The critic's trainer options.
        loss_config: The value loss options.
    """

    worker_cls = ValueWorker

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        trainer_config: TrainerConfig | None = None,
        loss_config: ValueLossConfig | None = None,
    ) -> None:
        super().__init__(model_path, trainer_config, loss_config or ValueLossConfig())  # type: ignore[arg-type]

    def compute_values(self, batch: Batch) -> list[list[float]]:
        """The critic's value of every response token, per sample (0.0 at mask-0 positions)."""
        if not batch.samples:
            return []
        flat = FlatSamples.from_samples(batch.samples)
        values: np.ndarray = self._recovering(lambda: self._call("compute_values", flat))[0]
        return [values[flat.response_slice(i)].tolist() for i in range(len(flat))]

    def update(self, batch: Batch) -> dict[str, float]:
        """One critic update on ``batch`` (samples with ``values`` and ``returns``).

        Returns:
            ``value_loss``, ``clip_fraction``, ``values_mean`` (means over the optimizer
            steps), ``grad_norm``, ``lr``, ``tokens``, ``samples``, ``time_s``, ... as
            `TrainerGroup.update`.
        """
        return super().update(batch)
