"""The tool-selection policy: a tiny small-vocab model, briefly warm-started on demonstrations.

The warm start is deliberately short: the policy learns the call format and only begins to
read the operation, so it picks the right tool about a third of the time; RL does the rest.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.tool_selection.agent import TOOLS, make_rows, noisy_expert_conversation

RECIPE = {"version": 2, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
          "warm_rows": 512, "expert_accuracy": 1.0, "steps": 120, "lr": 3e-3, "batch_size": 16}
"""Everything that decides the weights; its hash names the cache folder."""


def build(folder: Path, progress: bool = True) -> None:
    """Warm-start briefly on demonstrations and save into ``folder``."""
    rng = random.Random(0)
    conversations = [noisy_expert_conversation(r, rng, RECIPE["expert_accuracy"])
                     for r in make_rows(RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, RECIPE, conversations, tools=to_openai_tools(TOOLS),
                       progress=progress)


def model_path(progress: bool = True) -> Path:
    """The cached model folder, built on first use."""
    return cached_build("tool-selection", RECIPE, lambda folder: build(folder, progress))
