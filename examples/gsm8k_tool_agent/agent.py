"""The GSM8K tool agent (verl's seed scenario): a safe calculator and a checking tool.

The policy computes with ``calculator``, submits its answer to ``calc_gsm8k_reward`` (an
`sdk.RLTool`: per-rollout instance created with the row's ground truth, scored when the
rollout ends, then released), and replies ``#### N``. The rule reward checks that final line
against ``reward_model.ground_truth``; the checking tool's reward is a second component.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import BaseModel, Field

import agentrl_sdk as sdk
from examples.calculator.calculator import calculate
from examples.data.make_gsm8k_tool_data import sample_records, to_verl_row

TOOL_REWARD = 0.5
"""What a correct submission to calc_gsm8k_reward adds to the trajectory's reward."""
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 7*8 or (3+4)*2."""
    value = calculate(expression)
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


class _Answer(BaseModel):
    answer: str = Field(description="Your final answer, a number.")


class Gsm8kRewardTool(sdk.RLTool):
    """Checks a submitted answer against the row's ground truth (verl's Gsm8kTool).

    Its reward is ``TOOL_REWARD`` if the last submission was right; resubmitting a wrong
    answer after a right one does not lower it.
    """

    name: str = "calc_gsm8k_reward"
    description: str = "Submit your final answer to be checked."
    args_schema: type[BaseModel] = _Answer
    timeout_s: float | None = 5.0

    async def create(self, ground_truth: str = "", **_: Any) -> dict[str, Any]:
        return {"ground_truth": str(ground_truth), "reward": 0.0}

    async def execute(self, instance: dict[str, Any], answer: str = "", **_: Any) -> str:
        parsed = _parse_number(str(answer))
        correct = parsed is not None and parsed == instance["ground_truth"]
        instance["reward"] = max(instance["reward"], TOOL_REWARD * correct)
        return f"Current parsed answer={parsed} reward={float(correct)}"

    async def calc_reward(self, instance: dict[str, Any], **_: Any) -> float:
        return instance["reward"]


check_answer = Gsm8kRewardTool()
TOOLS = [calculator, check_answer]


@sdk.trainable("solver")
async def solver(state: MessagesState, config) -> dict:
    """The policy's turn: a tool call or the final ``#### N``."""
    llm = sdk.chat_model(config).bind_tools(TOOLS)
    return {"messages": [await llm.ainvoke(state["messages"])]}


def build_graph() -> Any:
    """solver -> tools -> solver ... -> end (the recursion limit ends a looping agent)."""
    graph = StateGraph(MessagesState)
    graph.add_node("solver", solver)
    graph.add_node("tools", sdk.ToolNode(TOOLS))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", sdk.tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def build_agents() -> dict[str, Any]:
    """The graphs by verl ``agent_name`` (the rows name ``gsm8k_tool_agent``)."""
    return {"gsm8k_tool_agent": build_graph()}


FORMAT_STEP = 0.1
"""Credit for each protocol step done cleanly: a calculator call that evaluated, a submission
to calc_gsm8k_reward, and a final ``#### N`` line (so at most 0.3); each malformed or failing
tool call (up to three) takes one step's credit back."""


def gsm8k_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> dict[str, float]:
    """Rule reward: ``answer`` 1 when the final ``#### N`` equals the ground truth, and a
    small ``format`` credit per protocol step (shaping for a policy that still learns it)."""
    messages = state["messages"]
    last = messages[-1]
    text = last.text if isinstance(last, AIMessage) else ""
    match = re.fullmatch(r"\s*####\s*(\S+)\s*", text)
    final = _parse_number(match.group(1)) if match else None
    replies = [m for m in messages if isinstance(m, ToolMessage) and m.status != "error"]
    steps = (
        any(m.name == "calculator" for m in replies),
        any(m.name == "calc_gsm8k_reward" for m in replies),
        final is not None,
    )
    return {
        "answer": float(final is not None and final == row["reward_model"]["ground_truth"]),
        "format": FORMAT_STEP * (sum(steps) - min(trajectory.metrics.get("tool_errors", 0), 3)),
    }


def _parse_number(text: str) -> str | None:
    match = _NUMBER.search(text.replace(",", ""))
    if match is None:
        return None
    value = float(match.group())
    return str(int(value)) if value.is_integer() else str(value)


def training_rows(count: int = 256, seed: int = 2) -> list[dict[str, Any]]:
    """verl-format rows from the project's generated GSM8K-format sample."""
    return [to_verl_row(r, i) for i, r in enumerate(sample_records(count, seed))]


def _call(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"<tool_call>\n{body}\n</tool_call>"


def expert_conversation(row: dict[str, Any], rng: random.Random, accuracy: float = 1.0
                        ) -> list[dict[str, Any]]:
    """A demonstration: calculator, submission, ``#### N``. With probability
    ``1 - accuracy`` the expert picks a wrong operator (what RL must fix)."""
    solution = row["extra_info"]["answer"]
    a, op, b = re.search(r"<<(\d+)([+\-*])(\d+)=", solution).groups()
    if rng.random() >= accuracy:
        op = rng.choice([o for o in "+-*" if o != op])
    result = calculator.func(f"{a}{op}{b}")
    truth = row["reward_model"]["ground_truth"]
    return [
        *row["prompt"],
        {"role": "assistant", "content": _call("calculator", {"expression": f"{a}{op}{b}"})},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": _call("calc_gsm8k_reward", {"answer": result})},
        {"role": "tool", "content": f"Current parsed answer={result} "
                                    f"reward={float(result == truth)}"},
        {"role": "assistant", "content": f"#### {result}"},
    ]
