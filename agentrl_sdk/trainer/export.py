"""What ``final_model`` folders hold: a normal HF folder of full weights, or a PEFT adapter
folder on top of the base, written by rank 0 from the tensors all ranks gather."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentrl_sdk.weights.adapters import AdapterWeights, write_adapter_folder

if TYPE_CHECKING:
    from agentrl_sdk.trainer.sharded_model import ShardedModel

__all__ = ["export_pretrained", "save_merged_folder"]

logger = logging.getLogger(__name__)


def export_pretrained(sharded: ShardedModel, path: str, form: str | None = None) -> None:
    """Writes ``sharded``'s current weights as a ``save_pretrained`` folder (rank 0; a
    collective), with the tokenizer and generation config of the model folder.

    With LoRA and ``form`` 'adapter' (default: ``lora.export``) the folder is a PEFT adapter on
    top of the model folder instead (plus its tokenizer); with 'merged' the adapters are merged
    into the weights.
    """
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
