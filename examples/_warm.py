"""How the examples make their CPU policies: a tiny small-vocab model or the real SmolLM2-135M,
warm-started briefly on demonstrations."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_sdk.allocator import keep_memory_lean, return_free_memory
from agentrl_sdk.models import (
    build_small_tokenizer,
    build_tiny_model,
    save_pretrained_pair,
    smollm2_path,
    supervised_warm_start,
)


def build_warm_started(
    folder: Path,
    recipe: dict[str, Any],
    conversations: Sequence[Sequence[dict[str, Any]]],
    *,
    tools: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> None:
    """Warm-start the model ``recipe`` names on ``conversations`` and save it with its
    tokenizer into ``folder``: the imported SmolLM2-135M-Instruct when ``recipe["base"]`` says
    ``smollm2-135m-instruct``, else a tiny model (vocab_size, hidden_size, num_layers). The
    warm start follows steps, lr, batch_size, dtype (default float32), tool_prompt (default
    hermes for SmolLM2, else auto) and activation_checkpointing (default off)."""
    # Before the import: its float32 copies are large blocks, each unmapped when freed, so
    # they do not stay in this process beside the warm start's training state.
    keep_memory_lean()
    base = smollm2_path() if recipe.get("base") == "smollm2-135m-instruct" else None
    return_free_memory()
    if base is not None:
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True,
                                                     dtype=torch.float32)
    else:
        tokenizer = build_small_tokenizer("hermes", vocab_size=recipe["vocab_size"])
        model = build_tiny_model(tokenizer, hidden_size=recipe["hidden_size"],
                                 num_layers=recipe["num_layers"])
    # SmolLM2's ChatML template ignores tools, so "auto" would pick hermes too (with a warning).
    default_prompt = "hermes" if base is not None else "auto"
    supervised_warm_start(model, tokenizer, conversations, tools=tools, steps=recipe["steps"],
                          lr=recipe["lr"], batch_size=recipe["batch_size"],
                          dtype=recipe.get("dtype", "float32"), progress=progress,
                          tool_prompt=recipe.get("tool_prompt", default_prompt),
                          activation_checkpointing=recipe.get("activation_checkpointing", False))
    save_pretrained_pair(model, tokenizer, folder)
    if base is not None:
        shutil.copy(base / "generation_config.json", folder)  # the stop ids import_model chose
