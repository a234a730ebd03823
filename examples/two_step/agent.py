"""Two-step word problems for a real model: the same ReAct agent and calculator as
`examples.word_problems`, but each story needs two calculator calls, and the second is where
the policy is unsure.

The first step of every story adds or subtracts (the warm start's skill); the second step adds,
subtracts, multiplies or divides. The warm start demonstrates only + and - second steps, so
after the first tool result the policy has to learn which operation comes next: the decision
sits after a shared, confident first call, the place tree rollouts branch
(`benchmarks/tree.py --config examples/two_step/config.yaml`).
"""

from __future__ import annotations

import json
import random
from typing import Any

from examples.calculator.calculator import calculate
from examples.word_problems.agent import build_graph, calculator, right_answer_reward

__all__ = [
    "build_graph", "calculator", "demonstration", "held_out_rows", "make_rows",
    "right_answer_reward", "training_rows",
]

SYSTEM = ("Solve the problem with the calculator tool, one step per call, then reply: "
          "The answer is N.")

# (first operation, second operation, story with numbers {a}, {b}, {c})
_STORIES: tuple[tuple[str, str, str], ...] = (
    ("+", "+", "A farm has {a} sheep. It buys {b} more in May and {c} more in June. "
               "How many sheep does it have now?"),
    ("+", "-", "Mia had {a} stickers, got {b} more, then gave away {c}. "
               "How many stickers does she have?"),
    ("-", "+", "A shop had {a} apples, sold {b}, then got a delivery of {c}. "
               "How many apples does it have?"),
    ("-", "-", "A bus had {a} people. {b} got off at the first stop and {c} at the second. "
               "How many people are still on the bus?"),
    ("+", "*", "A class has {a} girls and {b} boys. Each child gets {c} pencils. "
               "How many pencils are given out?"),
    ("-", "*", "A team had {a} players and {b} left. Each player still there scores {c} "
               "points. How many points does the team score?"),
    ("+", "/", "{a} red and {b} blue marbles are shared equally by {c} kids. "
               "How many marbles does each kid get?"),
    ("-", "/", "A baker made {a} cookies and ate {b}. The rest are packed in bags of {c}. "
               "How many bags are filled?"),
)


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
    count: int, seed: int = 0, second_weights: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """``count`` two-step problems; the seed decides them. Stories are drawn uniformly, or so
    that each second operation comes up in proportion to ``second_weights``."""
    rng = random.Random(seed)
    weights = None
    if second_weights is not None:
        stories_of = {op: sum(s == op for _, s, _ in _STORIES) for _, op, _ in _STORIES}
        weights = [second_weights[s] / stories_of[s] for _, s, _ in _STORIES]
    rows = []
    for i in range(count):
        first, second, story = (
            rng.choice(_STORIES) if weights is None else rng.choices(_STORIES, weights)[0])
        a, b, c = _numbers(rng, first, second)
        step_one = f"{a}{first}{b}"
        middle = str(int(calculate(step_one)))
        step_two = f"{middle}{second}{c}"
        rows.append({
            "id": f"ts-{seed}-{i}",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": story.format(a=a, b=b, c=c)},
            ],
            "steps": [step_one, step_two],
            "operations": first + second,
            "answer": str(int(calculate(step_two))),
        })  # fmt: skip
    return rows


TRAINING_WEIGHTS = {"+": 1.0, "-": 1.0, "*": 3.0, "/": 3.0}
"""RL practises most the second steps the warm start never showed (as word_problems does)."""


def training_rows() -> list[dict[str, Any]]:
    """The RL training problems, none of them held out."""
    held_out = {r["messages"][1]["content"] for r in held_out_rows()}
    rows = make_rows(2000, seed=1, second_weights=TRAINING_WEIGHTS)
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
