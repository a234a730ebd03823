"""The policy: SmolLM2-135M-Instruct, warm-started briefly on the task's own generated examples.

Zero-shot the model answers in prose and never writes ``<answer>`` tags, so every reward is 0
and GRPO has nothing to compare. A short supervised warm start on rows the task's generator
makes from seeds far from the training and held-out ones (question -> ``<answer>X</answer>``)
teaches the format and leaves the task itself partly solved: what RL then improves.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from agentrl_sdk.environments.reasoning_gym import reasoning_gym
from agentrl_sdk.hardware import PREFER_BF16, resolve_dtype
from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started

DEMONSTRATION_SEED = 1_000_000
"""Far from the training (1...) and held-out seed ranges: reasoning-gym's row i of seed s
comes from Random(s + i)."""


def recipe(task: str, config: dict[str, Any] | None = None, *, held_out: tuple[int, int],
           rows: int = 256, steps: int = 12) -> dict[str, Any]:
    """Everything that decides the warm-started weights; its hash names the cache folder.
    ``held_out`` is the (eval_seed, eval_size) whose questions are never demonstrated."""
    return {"version": 1, "base": "smollm2-135m-instruct", "task": task, "config": config or {},
            "held_out": list(held_out), "rows": rows, "steps": steps, "lr": 3e-5,
            "batch_size": 8, "dtype": resolve_dtype(PREFER_BF16), "seed": DEMONSTRATION_SEED}


def demonstrations(task: str, config: dict[str, Any] | None, rows: int,
                   held_out: tuple[int, int]) -> list[list[dict]]:
    """The generator's own questions answered the way the reward reads them; a question that
    is also held out is left out (small tasks repeat questions by chance)."""
    eval_seed, eval_size = held_out
    env = reasoning_gym(task, size=rows, seed=DEMONSTRATION_SEED, eval_size=eval_size,
                        eval_seed=eval_seed, config=config)
    return [[*row["messages"],
             {"role": "assistant",
              "content": f"<answer>{row['reasoning_gym']['entry']['answer']}</answer>"}]
            for row in env.rows]


def build(folder: Path, spec: dict[str, Any], progress: bool = True) -> None:
    """Warm-start the imported SmolLM2 on ``spec``'s demonstrations into ``folder``."""
    shown = demonstrations(spec["task"], spec["config"], spec["rows"], tuple(spec["held_out"]))
    build_warm_started(folder, spec, shown, progress=progress)


def warm_started(task: str, config: dict[str, Any] | None = None, *,
                 held_out: tuple[int, int], rows: int = 256, steps: int = 12,
                 progress: bool = True) -> Path:
    """The cached warm-started folder for ``task``, built on first use (a few minutes)."""
    spec = recipe(task, config, held_out=held_out, rows=rows, steps=steps)
    return cached_build(f"reasoning-gym-{task}-smollm2", spec,
                        partial(build, spec=spec, progress=progress), isolated=True)


def model_path() -> Path:
    """The example's policy (``model.builder`` in its config): warm-started on its task."""
    from examples.reasoning_gym.agent import CONFIG, HELD_OUT_ROWS, HELD_OUT_SEED, TASK

    return warm_started(TASK, CONFIG, held_out=(HELD_OUT_SEED, HELD_OUT_ROWS))
