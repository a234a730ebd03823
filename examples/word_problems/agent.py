"""Arithmetic word problems for a real model: a LangGraph ReAct agent with a safe calculator.

The policy reads a short story with 2- and 3-digit numbers, calls the calculator with the
right expression, and states the result. The reward is 1 for the right final number, else 0.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from examples.calculator.agent import react_graph
from examples.calculator.calculator import calculate

SYSTEM = "Solve the problem with the calculator tool, then reply: The answer is N."

# (operation, story): each story names its numbers {a} and {b}; division stories divide evenly.
_STORIES: tuple[tuple[str, str], ...] = (
    ("+", "A farm has {a} sheep and buys {b} more. How many sheep does it have now?"),
    ("+", "Mia read {a} pages on Monday and {b} pages on Tuesday. How many pages did she read?"),
    ("+", "A school has {a} girls and {b} boys. How many children are there?"),
    ("-", "A shop had {a} apples and sold {b}. How many apples are left?"),
    ("-", "Tom had {a} dollars and spent {b}. How many dollars does he have left?"),
    ("-", "A train carried {a} people and {b} got off. How many people are still on it?"),
    ("*", "There are {a} boxes with {b} pencils in each box. How many pencils are there?"),
    ("*", "A baker makes {a} trays of {b} cookies. How many cookies does he make?"),
    ("*", "Each of {a} buses carries {b} people. How many people do the buses carry?"),
    ("/", "{a} stickers are shared equally by {b} kids. How many stickers does each kid get?"),
    ("/", "{a} eggs are packed in boxes of {b}. How many boxes are filled?"),
)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 23*17."""
    value = calculate(expression)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def build_graph() -> Any:
    """solver -> (calculator -> solver)* -> end: the calculator example's ReAct loop."""
    return react_graph([calculator])


def _numbers(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "*":
        return rng.randint(11, 99), rng.randint(3, 30)
    if op == "/":
        b = rng.randint(3, 25)
        return b * rng.randint(4, 40), b
    a, b = rng.randint(100, 999), rng.randint(10, 99 if op == "-" else 999)
    return a, b


def make_rows(
    count: int, seed: int = 0, op_weights: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """``count`` word problems; the seed decides them (training and held-out seeds differ).

    Stories are drawn uniformly, or so that each operation comes up in proportion to its
    ``op_weights`` (its stories share its weight).
    """
    rng = random.Random(seed)
    weights = None
    if op_weights is not None:
        stories_of = {op: sum(o == op for o, _ in _STORIES) for op, _ in _STORIES}
        weights = [op_weights[op] / stories_of[op] for op, _ in _STORIES]
    rows = []
    for i in range(count):
        op, story = rng.choice(_STORIES) if weights is None else rng.choices(_STORIES, weights)[0]
        a, b = _numbers(rng, op)
        expression = f"{a}{op}{b}"
        rows.append({
            "id": f"wp-{seed}-{i}",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": story.format(a=a, b=b)},
            ],
            "expression": expression,
            "answer": str(int(calculate(expression))),
        })
    return rows


TRAINING_OP_WEIGHTS = {"+": 1.0, "-": 1.0, "*": 3.0, "/": 3.0}
"""RL practises most what the warm start never showed: a group of + or - problems is solved by
all of its samples from the start (equal rewards, no gradient), so uniform stories left half of
each update's groups flat. Some + and - stay so the demonstrated skill is kept up."""


def training_rows() -> list[dict[str, Any]]:
    """The RL training problems (mostly multiplication and division, see above), none of
    them held out."""
    held_out = {r["messages"][1]["content"] for r in held_out_rows()}
    rows = make_rows(2000, seed=1, op_weights=TRAINING_OP_WEIGHTS)
    return [r for r in rows if r["messages"][1]["content"] not in held_out]


def held_out_rows() -> list[dict[str, Any]]:
    """Problems never trained on (another seed, stories drawn uniformly), for greedy held-out
    accuracy."""
    return make_rows(64, seed=2)


def demonstration(row: dict[str, Any]) -> list[dict[str, Any]]:
    """How a competent agent solves ``row``: a calculator call, then the answer."""
    call = json.dumps({"name": "calculator", "arguments": {"expression": row["expression"]}})
    return [
        *row["messages"],
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": row["answer"]},
        {"role": "assistant", "content": f"The answer is {row['answer']}."},
    ]


_LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def right_answer_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> float:
    """1 if the final message's last number is the answer, else 0."""
    final = state["messages"][-1]
    if not isinstance(final, AIMessage) or final.tool_calls:
        return 0.0
    numbers = _LAST_NUMBER.findall(str(final.content))
    return float(bool(numbers) and numbers[-1] == row["answer"])
