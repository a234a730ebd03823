"""The critic of PPO with a value model: `ValueWorker` ranks (the policy's `ShardedModel` with
a value head, trained with the clipped value loss) driven by a `CriticGroup`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch

from agentrl_sdk.algorithms import ValueLossConfig
from agentrl_sdk.algorithms.objectives import VALUE_METRIC_SHARES, value_objective
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.group import TrainerGroup
from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch
from agentrl_sdk.trainer.layers import freeze_all_but_last
from agentrl_sdk.trainer.sharded_model import ShardedModel, ShardedRank
from agentrl_sdk.trainer.update_loop import Objective, per_token, train
from agentrl_sdk.types import Batch

if TYPE_CHECKING:
    from torch import nn

__all__ = ["BackboneWithValueHead", "CriticGroup", "ValueWorker"]


class ValueWorker(ShardedRank):
    """One critic rank: the model folder's backbone with a ``Linear(hidden, 1)`` value head
    (transformers' ``AutoModelForTokenClassification`` with one label, as verl's critic), as
    the policy's `ShardedModel` (sharded, optimised and checkpointed alike) trained with the
    clipped value loss by the shared `update_loop`.

    The head starts at zero (every value 0), so the first advantages are the plain returns and
    every rank starts from the same weights. The value of response token ``t`` is the head's
    output at the position that predicts it: the state before the token is sampled.
    ``adapters`` must be empty (the group passes the policy's argument list).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        config: TrainerConfig,
        loss_config: ValueLossConfig,
        adapters: Sequence[str] = (),
    ) -> None:
        if config.lora is not None or adapters:
            raise ValueError("the critic trains every weight of its model: no LoRA")
        self.loss_config = loss_config
        self.sharded = ShardedModel(
            rank, world_size, model_path, config, loader=_value_model, freeze=_freeze_with_head
        )
        self._objective = Objective(self._value_loss, loss_config.agg, VALUE_METRIC_SHARES)

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        """``(B, T)`` values of the states before each response token."""
        out = self.sharded.model(**batch.model_inputs(), use_cache=False)
        scores = out.logits[..., 0].float()  # (rows, L)
        # Kept logit k of `pack` is absolute position k + L - num_logits.
        offset = batch.input_ids.shape[1] - batch.num_logits
        return scores[batch.rows[:, None], batch.logit_index + offset]  # (B, T)

    def compute_values(self, flat: FlatSamples) -> np.ndarray:
        """The critic's value of every response token (laid out like ``flat.response_ids``,
        0.0 at mask-0 positions); identical on every rank."""
        return per_token(self.sharded, flat, self._values)

    def update(self, flat: FlatSamples) -> dict[str, float]:
        """One update of the value loss on ``flat``, with the metrics of `update_loop.train`."""
        if flat.values is None or flat.returns is None:
            raise ValueError("a critic update needs samples with values and returns (GAE)")
        return train(self.sharded, flat, self._objective)

    def _value_loss(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch: the critic's values, then the value objective."""
        return value_objective(self._values(batch), batch, self.loss_config)


def _value_model(path: str) -> nn.Module:
    """The backbone of the causal LM in ``path`` with a zero ``Linear(hidden, 1)`` value head."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(path, local_files_only=True, num_labels=1)
    config.classifier_dropout = 0.0
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the new head is "not initialized from the model"
    try:
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, local_files_only=True, dtype=torch.float32
        )
    except ValueError:  # an architecture transformers has no token-classification class for
        model = BackboneWithValueHead.from_pretrained(path)
    finally:
        hf_logging.set_verbosity(verbosity)
    head = _value_head(model)
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    return model


def _freeze_with_head(model: nn.Module, layers: Sequence[nn.Module], count: int | None) -> None:
    freeze_all_but_last(model, layers, count)
    _value_head(model).requires_grad_(True)  # the head always trains


class BackboneWithValueHead(torch.nn.Module):
    """``AutoModel`` backbone + ``Linear(hidden, 1)`` on its last hidden states: the value model
    of an architecture without a ``...ForTokenClassification`` class in transformers."""

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
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> SimpleNamespace:
        """``logits``: ``(B, L, 1)`` values, as a token-classification model returns them."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=use_cache)  # fmt: skip
        return SimpleNamespace(logits=self.score(out.last_hidden_state))


def _value_head(model: nn.Module) -> torch.nn.Linear:
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"cannot find the value head of {type(model).__name__} (no Linear "
                         "'score' or 'classifier')")
    return head


class CriticGroup(TrainerGroup):
    """``world_size`` `ValueWorker` actors beside the policy's: the same start-up, lockstep
    calls, rank recovery (rebuild, last checkpoint, replayed updates) and checkpoints. Its
    ``update`` (samples with ``values`` and ``returns``) returns ``value_loss``,
    ``clip_fraction``, ``values_mean``, ``grad_norm``, ``lr``, ... as `TrainerGroup.update`.
    ``model_path``: the policy's, or a folder of its own with the same tokenizer.
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
        return self._per_token(ValueWorker.compute_values, batch)
