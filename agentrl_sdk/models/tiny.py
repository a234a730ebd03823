"""Tiny random Qwen2 or Llama models for CPU tests and demos, saved with their tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

__all__ = ["build_tiny_model", "load_pretrained_pair", "save_pretrained_pair"]

Architecture = Literal["qwen2", "llama"]

_VOCAB_MULTIPLE = 64
_ARCHITECTURES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def _token_id(tokenizer: PreTrainedTokenizerBase, role: str) -> int:
    token = getattr(tokenizer, f"{role}_token", None)
    token_id = tokenizer.convert_tokens_to_ids(token) if token else None
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(
            f"the tokenizer has no {role} token; build it with build_qwen_tokenizer, "
            "build_small_tokenizer or build_llama3_tokenizer"
        )
    return token_id


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    architecture: Architecture = "qwen2",
) -> PreTrainedModel:
    """Builds a small float32 Qwen2 or Llama model with seeded random weights, sized for
    ``tokenizer``.

    The embedding has ``len(tokenizer)`` rounded up to a multiple of 64 rows (as real
    checkpoints pad theirs); generation stops on the tokenizer's eos or pad token and pads
    with the pad token (Qwen tokenizers: ``<|im_end|>``, ``<|endoftext|>``). Returned in eval
    mode; the global torch RNG is left untouched.

    Args:
        tokenizer: A tokenizer from :mod:`agentrl_sdk.models.tokenizers` or
            :mod:`agentrl_sdk.models.llama_tokenizer` (or any with eos and pad tokens).
        hidden_size: Width of the residual stream; a multiple of ``num_heads``.
        num_heads: Attention heads; a multiple of ``num_kv_heads`` (grouped-query attention).
        intermediate_size: MLP width; defaults to ``4 * hidden_size``.
        seed: Seed of the weight initialisation: same seed, same weights.
        architecture: ``qwen2`` (Qwen2ForCausalLM: biased q/k/v) or ``llama``
            (LlamaForCausalLM, bos from the tokenizer).

    Raises:
        ValueError: If the head counts do not divide, the architecture is unknown, or the
            tokenizer lacks an eos or pad token.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size={hidden_size} must be a multiple of num_heads={num_heads}, and "
            f"num_heads a multiple of num_kv_heads={num_kv_heads}"
        )
    if architecture not in _ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {architecture!r}; choose one of {sorted(_ARCHITECTURES)}"
        )
    config_cls, model_cls = _ARCHITECTURES[architecture]
    eos_id, pad_id = _token_id(tokenizer, "eos"), _token_id(tokenizer, "pad")
    # Qwen2 checkpoints carry no bos; Llama ones name theirs.
    bos_id = tokenizer.bos_token_id if architecture == "llama" else None
    vocab_size = -(-len(tokenizer) // _VOCAB_MULTIPLE) * _VOCAB_MULTIPLE
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=bos_id, do_sample=False
    )
    return model.eval()


def save_pretrained_pair(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path
) -> Path:
    """Writes ``model`` (safetensors) and ``tokenizer`` into one ``save_pretrained`` folder
    (created if missing) and returns it as a ``Path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_pretrained_pair(
    path: str | Path,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads ``(model, tokenizer)`` written by :func:`save_pretrained_pair`, from disk only,
    the model in float32 and eval mode.

    Raises:
        FileNotFoundError: If ``path`` is not a folder (nothing is looked up on a hub).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no model folder at {path}; write one with save_pretrained_pair")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer
