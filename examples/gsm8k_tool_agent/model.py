"""The GSM8K tool agent's CPU policies, warm-started on demonstrations: a tiny small-vocab
model (`model_path`) or the real SmolLM2-135M-Instruct (`real_model_path`, config_real.yaml).

The demonstrations pick the right operator only part of the time, so RL has something to
learn; the recipe's hash names the cache folder, so the second run starts at once.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.hardware import PREFER_BF16, resolve_dtype
from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.gsm8k_tool_agent.agent import TOOLS, expert_conversation, training_rows

RECIPE = {"version": 1, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
          "warm_rows": 512, "expert_accuracy": 0.6, "steps": 200, "lr": 3e-3, "batch_size": 16}
"""Everything that decides the weights."""


def build(folder: Path, progress: bool = True) -> None:
    """Warm-start on demonstrations and save into ``folder``."""
    rng = random.Random(0)
    conversations = [expert_conversation(r, rng, RECIPE["expert_accuracy"])
                     for r in training_rows(RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, RECIPE, conversations, tools=to_openai_tools(TOOLS),
                       progress=progress)


def model_path(progress: bool = True) -> Path:
    """The cached model folder, built on first use."""
    return cached_build("gsm8k-tool-agent", RECIPE, lambda folder: build(folder, progress))


REAL_RECIPE = {"version": 1, "base": "smollm2-135m-instruct", "warm_rows": 400,
               "expert_accuracy": 0.6, "steps": 12, "lr": 3e-5, "batch_size": 8,
               "dtype": resolve_dtype(PREFER_BF16)}
"""The SmolLM2 warm start: as short as the word-problem demo's, on the same 60%-right experts."""


def build_real(folder: Path, progress: bool = True) -> None:
    """Warm-start SmolLM2 on demonstrations and save into ``folder``."""
    rng = random.Random(0)
    conversations = [expert_conversation(r, rng, REAL_RECIPE["expert_accuracy"])
                     for r in training_rows(REAL_RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, REAL_RECIPE, conversations, tools=to_openai_tools(TOOLS),
                       progress=progress)


def real_model_path(progress: bool = True) -> Path:
    """The cached warm-started SmolLM2 folder, built on first use."""
    return cached_build("gsm8k-tool-agent-smollm2", REAL_RECIPE,
                        partial(build_real, progress=progress), isolated=True)
