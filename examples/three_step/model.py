"""The three-step policy: SmolLM2-135M-Instruct warm-started on every first and middle sentence
of the task and six of its eight last ones; one phrasing of multiplying and one of dividing are
left for RL."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from agentrl_sdk.hardware import PREFER_BF16, resolve_dtype
from agentrl_sdk.models import cached_build
from examples.three_step.agent import DEMONSTRATED, make_rows
from examples.two_step import model as two_step

RECIPE = {"version": 2, "base": "smollm2-135m-instruct", "task": "three-step",
          "demonstrated": DEMONSTRATED, "rows": 600, "steps": 72, "lr": 3e-5, "batch_size": 8,
          "dtype": resolve_dtype(PREFER_BF16), "tool_prompt": "auto"}
"""Everything that decides the weights; its hash names the cache folder."""


def demonstrations() -> list[list[dict]]:
    """Problems with a demonstrated last sentence, solved the right way (seed apart from
    training)."""
    return two_step.demonstrations(make_rows, RECIPE)


def build(folder: Path, progress: bool = True) -> None:
    """Warm-start the imported SmolLM2 on the demonstrations and save it into ``folder``."""
    two_step.build(folder, progress, RECIPE, demonstrations())


def model_path(progress: bool = True) -> Path:
    """The cached warm-started folder, built on first use (~9 min on 2 cores)."""
    return cached_build("three-step-smollm2", RECIPE, partial(build, progress=progress),
                        isolated=True)
