"""One rank of the policy trainer: a `ShardedModel` trained with the globally normalised PPO
objective, and the ``final_model`` folders it exports (a normal HF folder of full weights, or a
PEFT adapter folder on top of the base). Runs inside a Ray actor (see `TrainerGroup`) but
imports no Ray at module level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from agentrl_sdk.algorithms import PolicyLossConfig, importance_weights
from agentrl_sdk.algorithms.objectives import (
    PolicyOutputs,
    inert_without_signal,
    policy_metric_shares,
    policy_objective,
)
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch
from agentrl_sdk.trainer.sharded_model import ShardedModel, ShardedRank
from agentrl_sdk.trainer.token_logprobs import response_logprobs
from agentrl_sdk.trainer.update_loop import Objective, per_token, train
from agentrl_sdk.weights.adapters import AdapterWeights, write_adapter_folder

if TYPE_CHECKING:
    from torch import nn

__all__ = ["PolicyWorker", "on_adapter", "save_merged_folder"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class PolicyWorker(ShardedRank):
    """One rank: a `ShardedModel` (the causal LM, FSDP2, LoRA adapters, AdamW) trained with
    ``ppo_policy_loss`` (+ KL, - entropy) by the shared `update_loop`.

    Its methods are what `TrainerGroup` calls on every rank (`RankSet.call`).

    Args:
        adapters: With ``config.lora``, the names of the LoRA adapters to hold (several
            policies as adapters of one base: one PEFT adapter and one optimizer each, see
            `for_adapter`); empty: one adapter, ``"default"``.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        config: TrainerConfig,
        loss_config: PolicyLossConfig,
        adapters: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.loss_config = loss_config
        self.sharded = ShardedModel(
            rank, world_size, model_path, config, reference=loss_config.kl_coef > 0,
            adapters=adapters,
        )  # fmt: skip
        self._objective = Objective(
            self._ppo_loss, loss_config.agg, policy_metric_shares(loss_config),
            skips_inert=inert_without_signal(loss_config),
        )  # fmt: skip

    def for_adapter(self, adapter: str, method: Callable[..., _T], *args: Any) -> _T:
        """``method(self, *args)`` for LoRA adapter ``adapter``: with it active in the forward
        and its own optimizer, schedule and counters (the first adapter is active again after).

        Raises:
            ValueError: The worker holds no such adapter, or ``method`` is not per adapter.
        """
        sharded = self.sharded
        if adapter not in sharded.adapters or method not in _PER_ADAPTER:
            raise ValueError(
                f"for_adapter({adapter!r}, {method.__name__}): adapters are "
                f"{list(sharded.adapters)}, methods {sorted(m.__name__ for m in _PER_ADAPTER)}"
            )
        previous = sharded.active
        sharded.switch(adapter)
        try:
            return method(self, *args)
        finally:
            sharded.switch(previous)

    def _logprobs(
        self, model: nn.Module, batch: PackedBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Trained-token logprobs ``(B, T)`` at the configured temperature, and their
        entropies when asked (`response_logprobs`)."""
        return response_logprobs(model, batch, self.config.temperature, with_entropy=with_entropy)

    def compute_logprobs(self, flat: FlatSamples) -> np.ndarray:
        """Logprobs of every response token under the current weights, a float32 array laid
        out like ``flat.response_ids``, 0.0 at mask-0 positions (as ``Sample.old_logprobs``);
        identical on every rank."""
        model = self.sharded.model
        return per_token(self.sharded, flat, lambda batch: self._logprobs(model, batch)[0])

    def update(self, flat: FlatSamples) -> dict[str, float]:
        """One update of the PPO objective on ``flat``, with the metrics of `update_loop.train`
        and of the old-logprob correction."""
        flat, correction = self._prepared(flat)
        return train(self.sharded, flat, self._objective) | correction

    def _prepared(self, flat: FlatSamples) -> tuple[FlatSamples, dict[str, float]]:
        """The batch as the optimizer steps use it, and the metrics of that preparation: with a
        correction, proximal old logprobs (recomputed here) and the off-policy weights
        ``pi_prox / pi_behav`` of its recorded behaviour logprobs (identical on every rank)."""
        lc = self.loss_config
        if lc.correction == "none":
            if self.config.recompute_old_logprobs:
                return flat.with_old_logprobs(self.compute_logprobs(flat)), {}
            return flat, {}
        prox = self.compute_logprobs(flat)
        weights, metrics = importance_weights(
            torch.from_numpy(prox), torch.from_numpy(flat.old_logprobs),
            torch.from_numpy(flat.response_mask), lc.correction, lc.is_cap,
        )  # fmt: skip
        return flat.with_old_logprobs(prox).with_token_weights(weights.numpy()), metrics

    def _ppo_loss(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch: the model's outputs (and the reference's, with a KL term), then
        the PPO objective."""
        logp, entropy = self._logprobs(self.sharded.model, batch, with_entropy=True)
        reference_logp = None
        if self.loss_config.kl_coef > 0:
            with torch.no_grad(), self.sharded.reference() as reference:
                reference_logp = self._logprobs(reference, batch)[0]
        outputs = PolicyOutputs(logp, entropy, reference_logp)
        return policy_objective(outputs, batch, self.loss_config)

    def export_pretrained(self, path: str, form: str | None = None) -> None:
        """Writes the current weights as a ``save_pretrained`` folder (rank 0; a collective),
        with the tokenizer and generation config of the model folder.

        With LoRA and ``form`` 'adapter' (default: ``lora.export``) the folder is a PEFT adapter
        on top of the model folder instead (plus its tokenizer); with 'merged' the adapters are
        merged into the weights.
        """
        sharded = self.sharded
        lora = sharded.config.lora
        if lora is not None and (form or lora.export) == "adapter":
            adapter = sharded.gather_adapter()
            if sharded.rank == 0:
                weights = AdapterWeights(adapter, lora.scaling, sharded.transposed)
                write_adapter_folder(path, weights, base_model=sharded.model_path)
                _save_tokenizer(path, sharded.model_path)
        else:
            state = sharded.gather_bucket([k for keys, _ in sharded.engine_tensors() for k in keys])
            if sharded.rank == 0:
                save_merged_folder(path, sharded.model_path, state)
        dist.barrier()


_PER_ADAPTER = frozenset({
    PolicyWorker.update, PolicyWorker.compute_logprobs, PolicyWorker.export_pretrained,
    ShardedRank.gather_packed_adapter, ShardedRank.save_checkpoint, ShardedRank.load_checkpoint,
})  # fmt: skip
"""The calls `PolicyWorker.for_adapter` makes for one adapter."""


def on_adapter(adapter: str | None, method: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """`RankSet.call` arguments of ``method(*args)``, for LoRA ``adapter`` if named."""
    if adapter is None:
        return (method, *args)
    return (PolicyWorker.for_adapter, adapter, method, *args)


def save_merged_folder(path: str | Path, model_path: str, state: dict[str, torch.Tensor]) -> None:
    """Writes ``state`` (full weights, the base model's keys) as a ``save_pretrained`` folder
    in the model folder's dtype, with its generation config and tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    saved_dtype = getattr(config, "dtype", None)
    if isinstance(saved_dtype, torch.dtype):
        model.to(saved_dtype)
    if (Path(model_path) / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(
            model_path, local_files_only=True
        )
    model.save_pretrained(path)
    _save_tokenizer(path, model_path)


def _save_tokenizer(path: str | Path, model_path: str) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError):
        logger.warning("no tokenizer in %s; exported the model only", model_path)
    else:
        tokenizer.save_pretrained(path)
