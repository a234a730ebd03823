"""The two-step policy: SmolLM2-135M-Instruct warm-started on every first sentence of the task
and six of its eight second ones; one phrasing of multiplying and one of dividing are left for
RL."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.hardware import PREFER_BF16, resolve_dtype
from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.two_step.agent import DEMONSTRATED, calculator, demonstration, make_rows

RECIPE = {"version": 3, "base": "smollm2-135m-instruct", "task": "two-step",
          "demonstrated": DEMONSTRATED, "rows": 400, "steps": 36, "lr": 3e-5, "batch_size": 8,
          "dtype": resolve_dtype(PREFER_BF16), "tool_prompt": "auto"}
"""Everything that decides the weights; its hash names the cache folder."""


def demonstrations(
    make: Callable[..., list[dict]] = make_rows, recipe: dict[str, Any] = RECIPE
) -> list[list[dict]]:
    """Problems (of ``make``'s task) with a demonstrated second sentence, solved the right way
    (seed apart from training)."""
    rows = [r for r in make(3000, seed=7) if r["second"] in recipe["demonstrated"]]
    return [demonstration(r) for r in rows[: recipe["rows"]]]


def build(
    folder: Path,
    progress: bool = True,
    recipe: dict[str, Any] = RECIPE,
    conversations: list[list[dict]] | None = None,
) -> None:
    """Warm-start the imported SmolLM2 on the demonstrations (``recipe``'s, of this task unless
    ``conversations`` are given) and save it into ``folder``."""
    build_warm_started(folder, recipe, conversations or demonstrations(recipe=recipe),
                       tools=to_openai_tools([calculator]), progress=progress)


def model_path(progress: bool = True) -> Path:
    """The cached warm-started folder, built on first use (~5 min on 2 cores)."""
    return cached_build("two-step-smollm2", RECIPE, partial(build, progress=progress),
                        isolated=True)
