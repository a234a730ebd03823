"""Three-step word problems: a two-step story (`examples.two_step`) with a routine sentence in
the middle, so the first two calculator calls are the warm start's skill and the decision to
learn comes after the second tool result.

A story is a first sentence that adds or subtracts, a middle one that adds or subtracts (all
demonstrated by the warm start), and the two-step task's deciding sentence (`SECOND`: six of
its eight phrasings demonstrated, one of multiplying and one of dividing left to RL). Most of a
rollout's tokens are the two routine calls: a trunk that tree rollouts generate and train once
when they branch after it (``rollout.tree.skip_first: 1``, `benchmarks/tree.py --config
examples/three_step/config.yaml --skip-first 1`).
"""

from __future__ import annotations

import random
from typing import Any

from examples.two_step import agent as two_step
from examples.two_step.agent import (
    DEMONSTRATED,
    FIRST,
    SECOND,
    TRAINING_WEIGHTS,
    build_graph,
    calculator,
    demonstration,
    right_answer_reward,
    story_row,
)

__all__ = [
    "DEMONSTRATED", "MIDDLE", "SECOND", "TRAINING_WEIGHTS", "build_graph", "calculator",
    "demonstration", "held_out_rows", "make_rows", "right_answer_reward", "training_rows",
]

# (operation, sentence with {m})
MIDDLE: tuple[tuple[str, str], ...] = (
    ("+", "Next, {m} more arrived."),
    ("+", "A friend gave them {m} more."),
    ("-", "Next, {m} of them were given away."),
    ("-", "Then {m} of them went missing."),
)


def _numbers(rng: random.Random, first: str, middle: str, last: str) -> tuple[int, ...]:
    """``a first b``, ``middle m``, ``last c``: every intermediate positive, division even."""
    if last in "+-":  # a >= 300: three differences stay above 0
        return (rng.randint(300, 999), *(rng.randint(10, 99) for _ in range(3)))
    c = rng.randint(3, 12)
    total = c * rng.randint(4, 30) if last == "/" else rng.randint(14, 60)
    m = rng.randint(2, min(9, total - 5))
    before = total - m if middle == "+" else total + m  # >= 5
    if first == "+":
        b = rng.randint(2, before - 2)
        return before - b, b, m, c
    b = rng.randint(10, 99)
    return before + b, b, m, c


def make_rows(
    count: int, seed: int = 0, weights: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """``count`` three-step problems; the seed decides them. First and middle sentences are
    drawn uniformly; the last ones uniformly, or in proportion to ``weights`` (by their names in
    `SECOND`)."""
    rng = random.Random(seed)
    names = list(SECOND)
    rows = []
    for i in range(count):
        (first, opening), (middle, step) = rng.choice(FIRST), rng.choice(MIDDLE)
        name = rng.choice(names) if weights is None else rng.choices(
            names, [weights[n] for n in names])[0]
        last, ending = SECOND[name]
        a, b, m, c = _numbers(rng, first, middle, last)
        text = f"{opening.format(a=a, b=b)} {step.format(m=m)} {ending.format(c=c)}"
        rows.append(story_row(f"th-{seed}-{i}", text, a, [(first, b), (middle, m), (last, c)],
                              name))  # fmt: skip
    return rows


def training_rows() -> list[dict[str, Any]]:
    """The RL training problems, none of them held out."""
    return two_step.training_rows(make_rows)


def held_out_rows() -> list[dict[str, Any]]:
    """64 problems never trained on (another seed, stories drawn uniformly)."""
    return make_rows(64, seed=2)
