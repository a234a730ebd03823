"""A reasoning-gym task for a real model: the task's rows, held-out rows, verifier and graph,
as the module-level factories a YAML config's ``entrypoint`` names.

Nothing here is written for the task: `agentrl_sdk.environments.reasoning_gym` turns
reasoning-gym's own generator and ``score_answer`` into rows, a reward and a one-call graph.
"""

from __future__ import annotations

import functools
from typing import Any

from agentrl_sdk.environments.reasoning_gym import ReasoningGym, reasoning_gym

TASK = "chain_sum"
CONFIG = {"max_terms": 3, "max_digits": 2}
"""reasoning-gym's own generator options: sums of 2-3 numbers of 1-2 digits."""
TRAINING_SEED, TRAINING_ROWS = 1, 2000
HELD_OUT_SEED, HELD_OUT_ROWS = 100_000, 64


@functools.cache
def environment() -> ReasoningGym:
    """The task: training rows from seed 1, held-out rows from a seed range far from them."""
    return reasoning_gym(TASK, size=TRAINING_ROWS, seed=TRAINING_SEED, eval_size=HELD_OUT_ROWS,
                         eval_seed=HELD_OUT_SEED, config=CONFIG)


def build_graph() -> Any:
    """The default graph: one trainable call that answers in ``<answer>`` tags."""
    return environment().graph


def training_rows() -> list[dict[str, Any]]:
    """The training rows (none of them held out)."""
    return environment().rows


def held_out_rows() -> list[dict[str, Any]]:
    """The held-out rows, for greedy evaluation before, during and after training."""
    return environment().eval_rows


def reward(state: Any, row: dict[str, Any], trajectory: Any) -> dict[str, float]:
    """The task's own ``score_answer`` on the reply's last ``<answer>``, as the component
    ``reasoning_gym/<task>``."""
    return environment().reward(state, row, trajectory)
