"""How the examples make their tiny CPU policies: a small-vocab model, warm-started briefly."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl_sdk.models import (
    build_small_tokenizer,
    build_tiny_model,
    save_pretrained_pair,
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
    """Warm-start a tiny model as ``recipe`` says (vocab_size, hidden_size, num_layers, steps,
    lr, batch_size) on ``conversations`` and save it with its tokenizer into ``folder``."""
    tokenizer = build_small_tokenizer("hermes", vocab_size=recipe["vocab_size"])
    model = build_tiny_model(tokenizer, hidden_size=recipe["hidden_size"],
                             num_layers=recipe["num_layers"])
    supervised_warm_start(model, tokenizer, conversations, tools=tools, steps=recipe["steps"],
                          lr=recipe["lr"], batch_size=recipe["batch_size"], progress=progress)
    save_pretrained_pair(model, tokenizer, folder)
