"""The word-problem policy: SmolLM2-135M-Instruct, warm-started on half of the task.

Zero-shot the model never writes a parseable tool call (0/64 here). A short supervised warm
start on addition and subtraction demonstrations teaches the call format; multiplication and
division stories are never demonstrated, so the policy starts by guessing their operation and
RL has something real to learn.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.hardware import PREFER_BF16, resolve_dtype
from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.word_problems.agent import calculator, demonstration, make_rows

RECIPE = {"version": 1, "base": "smollm2-135m-instruct", "demonstrated": "+-", "rows": 400,
          "steps": 12, "lr": 3e-5, "batch_size": 8, "dtype": resolve_dtype(PREFER_BF16),
          "tool_prompt": "hermes", "activation_checkpointing": True}
"""Everything that decides the weights; its hash names the cache folder (the dtype resolved:
bfloat16 on CPUs that compute it natively, float32 elsewhere)."""


def demonstrations() -> list[list[dict]]:
    """Addition and subtraction problems solved the right way (seed apart from training)."""
    rows = [r for r in make_rows(3000, seed=7)
            if any(op in r["expression"] for op in RECIPE["demonstrated"])]
    return [demonstration(r) for r in rows[: RECIPE["rows"]]]


def build(folder: Path, progress: bool = True) -> None:
    """Warm-start the imported SmolLM2 on the demonstrations and save it into ``folder``."""
    build_warm_started(folder, RECIPE, demonstrations(),
                       tools=to_openai_tools([calculator]), progress=progress)


def model_path(progress: bool = True) -> Path:
    """The cached warm-started folder, built on first use (~5 min on 2 cores)."""
    # Isolated: the warm start's ~2.5 GB of float32 weights, gradients and optimizer state
    # leave with its process.
    return cached_build("word-problems-smollm2", RECIPE, partial(build, progress=progress),
                        isolated=True)
