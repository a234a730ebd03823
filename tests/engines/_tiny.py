"""Tiny models shared by the engine tests: an in-memory id-only model for the TorchEngine tests,
and a model folder for the vLLM, pool and benchmark code paths (built once, cached)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import PreTrainedModel

from agentrl_sdk.models import (
    build_small_tokenizer,
    build_tiny_model,
    cached_build,
    save_pretrained_pair,
)

# head_dim 64: a size every vLLM CPU attention kernel supports.
# Untied: a random tied model mostly repeats its last token, a weak test of equal ids.
RECIPE = {
    "vocab": 1024, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
    "tied": False,
}


def tiny_model_dir(seed: int = 0) -> Path:
    """The folder of the tiny model with weights seeded by ``seed`` (float32, tied embedding)."""

    def build(folder: Path) -> None:
        tokenizer = build_small_tokenizer(vocab_size=RECIPE["vocab"])
        model = build_tiny_model(
            tokenizer,
            hidden_size=RECIPE["hidden_size"],
            num_layers=RECIPE["num_layers"],
            num_heads=RECIPE["num_heads"],
            num_kv_heads=RECIPE["num_kv_heads"],
            max_position_embeddings=2048,
            seed=seed,
            tie_word_embeddings=RECIPE["tied"],
        )
        save_pretrained_pair(model, tokenizer, folder)

    return cached_build("vllm-tiny", {**RECIPE, "seed": seed}, build)


ID_VOCAB = 512  # ids of the id-only model: 0..511


def id_model(seed: int = 0) -> PreTrainedModel:
    """A tiny untied Qwen2 (hidden 64, 2 layers, MLP 128) over ``ID_VOCAB`` ids, with no EOS.

    With no EOS an engine decodes exactly ``max_tokens``, as :func:`hf_greedy` does, so their
    ids compare one for one. The small BPE is 64 short of ``ID_VOCAB``: its added tokens round
    ``build_tiny_model``'s embedding back up to 512 rows.
    """
    model = build_tiny_model(
        build_small_tokenizer(vocab_size=ID_VOCAB - 64), hidden_size=64, num_layers=2,
        intermediate_size=128, max_position_embeddings=1024, seed=seed, tie_word_embeddings=False,
    )  # fmt: skip
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    return model


def hf_greedy(model: PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    """The ``n`` ids HF ``generate`` picks greedily after ``prompt``: the reference answer,
    computed with transformers' own SDPA attention (an engine serving ``model`` swaps in its own
    for decode steps)."""
    model = copy.deepcopy(model)
    model.set_attn_implementation("sdpa")
    out = model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()
