"""The supervisor's own tiny policy, briefly warm-started on unreliable routing demonstrations.

The workers reuse the tool-selection policy: ``default`` trains a copy of it, ``words``
serves another copy frozen.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.multi_agent.agent import make_mixed_rows, routing_demo

RECIPE = {"version": 1, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
          "warm_rows": 256, "accuracy": 0.6, "steps": 60, "lr": 3e-3, "batch_size": 16}


def build(folder: Path, progress: bool = True) -> None:
    rng = random.Random(0)
    demos = [routing_demo(r, rng, RECIPE["accuracy"])
             for r in make_mixed_rows(RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, RECIPE, demos, progress=progress)


def supervisor_path(progress: bool = True) -> Path:
    """The supervisor's cached model folder, built on first use."""
    return cached_build("multi-agent-supervisor", RECIPE, lambda folder: build(folder, progress))
