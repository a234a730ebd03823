"""A tiny model folder shared by the vLLM, pool and benchmark code paths (built once, cached)."""

from __future__ import annotations

from pathlib import Path

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
