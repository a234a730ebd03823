"""What ``final_model`` folders hold: a normal HF folder of full weights, or a PEFT adapter
folder on top of the base. Plain functions of gathered tensors, run on rank 0."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from agentrl_sdk.engines.lora_weights import AdapterWeights, write_adapter_folder

__all__ = ["save_adapter_folder", "save_merged_folder"]

logger = logging.getLogger(__name__)


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


def save_adapter_folder(path: str | Path, adapter: AdapterWeights, model_path: str) -> None:
    """Writes ``adapter`` as a PEFT adapter folder on top of ``model_path`` (recorded as
    ``base_model_name_or_path``), with the model folder's tokenizer."""
    write_adapter_folder(path, adapter, base_model=model_path)
    _save_tokenizer(path, model_path)


def _save_tokenizer(path: str | Path, model_path: str) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError):
        logger.warning("no tokenizer in %s; exported the model only", model_path)
    else:
        tokenizer.save_pretrained(path)
