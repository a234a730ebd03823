"""The supervisor's own tiny policy, briefly warm-started on unreliable routing demonstrations.

The workers reuse the tool-selection policy: ``default`` trains a copy of it, ``words``
serves another copy frozen.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentrl_sdk.models import (
    build_small_tokenizer,
    build_tiny_model,
    cached_build,
    save_pretrained_pair,
    supervised_warm_start,
)
from examples.multi_agent.agent import make_mixed_rows, routing_demo

RECIPE = {"version": 1, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
          "warm_rows": 256, "accuracy": 0.6, "steps": 60, "lr": 3e-3, "batch_size": 16}


def build(folder: Path, progress: bool = True) -> None:
    tokenizer = build_small_tokenizer("hermes", vocab_size=RECIPE["vocab_size"])
    model = build_tiny_model(tokenizer, hidden_size=RECIPE["hidden_size"],
                             num_layers=RECIPE["num_layers"])
    rng = random.Random(0)
    demos = [routing_demo(r, rng, RECIPE["accuracy"])
             for r in make_mixed_rows(RECIPE["warm_rows"], seed=1)]
    supervised_warm_start(model, tokenizer, demos, steps=RECIPE["steps"], lr=RECIPE["lr"],
                          batch_size=RECIPE["batch_size"], progress=progress)
    save_pretrained_pair(model, tokenizer, folder)


def supervisor_path(progress: bool = True) -> Path:
    """The supervisor's cached model folder, built on first use."""
    return cached_build("multi-agent-supervisor", RECIPE, lambda folder: build(folder, progress))
