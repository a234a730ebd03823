"""Two-step word problems for a real model: the same ReAct agent and calculator as
`examples.word_problems`, but each story needs two calculator calls, and the second is where
the policy is unsure.

A story is a first sentence that adds or subtracts (four of them, all demonstrated by the warm
start) and a second sentence that adds, subtracts, multiplies or divides what the first left,
in one of two phrasings each. The warm start demonstrates every first sentence and six of the
eight second ones (`DEMONSTRATED`): one phrasing of multiplying and one of dividing are left
for RL, to be worked out by analogy. So the first call is the warm start's skill, and the
decision to learn comes after its tool result: the place tree rollouts branch
(`benchmarks/tree.py --config examples/two_step/config.yaml`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from examples.calculator.calculator import calculate
from examples.word_problems.agent import build_graph, calculator, right_answer_reward

__all__ = [
    "DEMONSTRATED", "FIRST", "SECOND", "SYSTEM", "TRAINING_WEIGHTS", "build_graph", "calculator",
    "demonstration", "held_out_rows", "make_rows", "right_answer_reward", "story_row", "training_rows",
]

SYSTEM = ("Solve the problem with the calculator tool, one step per call, then reply: "
          "The answer is N.")

# (operation, sentence with {a} and {b})
FIRST: tuple[tuple[str, str], ...] = (
    ("+", "A farm had {a} sheep and bought {b} more."),
    ("+", "Mia had {a} stickers and got {b} more."),
    ("-", "A shop had {a} apples and sold {b}."),
    ("-", "A bus had {a} people and {b} got off."),
)
# (operation, sentence with {c}), by their names
SECOND: dict[str, tuple[str, str]] = {
    "+came": ("+", "Then {c} more came. How many are there now?"),
    "+added": ("+", "Later {c} more were added. How many are there in all?"),
    "-taken": ("-", "Then {c} were taken away. How many are left?"),
    "-lost": ("-", "Later {c} of them were lost. How many remain?"),
    "*points": ("*", "Each of them is worth {c} points. How many points are they worth?"),
    "*stamps": ("*", "Each of them needs {c} stamps. How many stamps are needed?"),
    "/shared": ("/", "They are shared equally by {c} kids. How many does each kid get?"),
    "/boxes": ("/", "They are packed in boxes of {c}. How many boxes are filled?"),
}

DEMONSTRATED = ("+came", "+added", "-taken", "-lost", "*points", "/shared")
"""The second sentences the warm start shows solved (with every first sentence)."""

TRAINING_WEIGHTS = {name: 1.0 if name in DEMONSTRATED else 4.0 for name in SECOND}
"""RL practises most the second sentences the warm start never showed (as word_problems
does): a group of demonstrated ones is mostly solved by all of its samples (no gradient)."""


def _numbers(rng: random.Random, first: str, second: str) -> tuple[int, int, int]:
    """``a first b`` then ``second c``, every intermediate positive; division goes evenly."""
    if second in "+-":  # a >= 200: both differences stay above 0
        return rng.randint(200, 999), rng.randint(10, 99), rng.randint(10, 99)
    c = rng.randint(3, 12)
    total = c * rng.randint(4, 30) if second == "/" else rng.randint(12, 60)
    if first == "+":
        b = rng.randint(2, total - 2)
        return total - b, b, c
    b = rng.randint(10, 99)
    return total + b, b, c


def make_rows(
    count: int, seed: int = 0, weights: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """``count`` two-step problems; the seed decides them. First sentences are drawn uniformly;
    second ones uniformly, or in proportion to ``weights`` (by their names in `SECOND`)."""
    rng = random.Random(seed)
    names = list(SECOND)
    rows = []
    for i in range(count):
        first, opening = rng.choice(FIRST)
        name = rng.choice(names) if weights is None else rng.choices(
            names, [weights[n] for n in names])[0]
        second, ending = SECOND[name]
        a, b, c = _numbers(rng, first, second)
        text = f"{opening.format(a=a, b=b)} {ending.format(c=c)}"
        rows.append(story_row(f"ts-{seed}-{i}", text, a, [(first, b), (second, c)], name))
    return rows


def story_row(
    row_id: str, text: str, start: int, moves: list[tuple[str, int]], second: str
) -> dict[str, Any]:
    """The problem ``text``: from ``start``, one calculator step per ``(operation, number)``
    of ``moves``; ``second`` names its deciding sentence."""
    steps, value = [], start
    for operation, number in moves:
        steps.append(f"{value}{operation}{number}")
        value = int(calculate(steps[-1]))
    return {
        "id": row_id,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "steps": steps,
        "operations": "".join(operation for operation, _ in moves),
        "second": second,
        "answer": str(value),
    }


def training_rows(make: Callable[..., list[dict[str, Any]]] = make_rows) -> list[dict[str, Any]]:
    """The RL training problems (of ``make``'s task), none of them held out."""
    held_out = {r["messages"][1]["content"] for r in make(64, seed=2)}
    rows = make(2000, seed=1, weights=TRAINING_WEIGHTS)
    return [r for r in rows if r["messages"][1]["content"] not in held_out]


def held_out_rows() -> list[dict[str, Any]]:
    """64 problems never trained on (another seed, stories drawn uniformly)."""
    return make_rows(64, seed=2)


def demonstration(row: dict[str, Any]) -> list[dict[str, Any]]:
    """How a competent agent solves ``row``: one calculator call per step, then the answer."""
    turns: list[dict[str, Any]] = []
    for step in row["steps"]:
        call = json.dumps({"name": "calculator", "arguments": {"expression": step}})
        turns += [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                  {"role": "tool", "content": str(int(calculate(step)))}]
    return [*row["messages"], *turns,
            {"role": "assistant", "content": f"The answer is {row['answer']}."}]
