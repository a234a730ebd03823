"""What ``final_model`` folders hold: a normal HF folder of full weights, or a PEFT adapter
folder on top of the base. Plain functions of gathered tensors, run on rank 0."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentrl_sdk.trainer.config import LoraConfig

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


def save_adapter_folder(
    path: str | Path,
    config: LoraConfig,
    adapter_state: dict[str, torch.Tensor],
    model_path: str,
    target_modules: list[str],
) -> None:
    """Writes a PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``)
    and the model folder's tokenizer.

    Args:
        adapter_state: Full adapter tensors in the file's keys (see `adapter_file_key`).
        model_path: The base model folder, recorded as ``base_model_name_or_path``.
        target_modules: The module names actually adapted; written instead of 'all-linear'
            so loaders that do not resolve it (vLLM) find concrete names.
    """
    from safetensors.torch import save_file

    from agentrl_sdk.trainer.lora import peft_config

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    resolved = config.model_copy(update={"target_modules": target_modules})
    peft_config(resolved, base_model_name_or_path=model_path).save_pretrained(folder)
    tensors = {k: v.detach().contiguous() for k, v in adapter_state.items()}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    _save_tokenizer(folder, model_path)


def _save_tokenizer(path: str | Path, model_path: str) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError):
        logger.warning("no tokenizer in %s; exported the model only", model_path)
    else:
        tokenizer.save_pretrained(path)
