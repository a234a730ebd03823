"""An arithmetic agent that must pick the right tool: add, subtract, multiply or divide.

The operands live in the graph state and the tools read them there (LangGraph's
``InjectedState``), so the skill to learn is *which* tool the question asks for. The warm
start teaches the call format with the tool chosen at random: an untrained policy is right a
quarter of the time, and RL has to learn to read the operation word in the question.
"""

from __future__ import annotations

import json
import random
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import InjectedState

import agentrl_sdk as sdk

SYSTEM = "You are an arithmetic agent. Call the one tool the question needs, then answer."
OPERATIONS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


@tool
def add(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Add the two numbers of the question."""
    return str(operands[0] + operands[1])


@tool
def subtract(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Subtract the second number of the question from the first."""
    return str(operands[0] - operands[1])


@tool
def multiply(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Multiply the two numbers of the question."""
    return str(operands[0] * operands[1])


@tool
def divide(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Divide the first number of the question by the second."""
    return str(operands[0] // operands[1])


TOOLS = [add, subtract, multiply, divide]


class State(TypedDict):
    messages: Annotated[list, add_messages]
    operands: list[int]


@sdk.trainable("solver")
async def solver(state: State, config) -> dict:
    """Ask the policy for a tool call or the final answer."""
    llm = sdk.chat_model(config).bind_tools(TOOLS)
    return {"messages": [await llm.ainvoke(state["messages"])]}


def build_graph() -> Any:
    """solver -> tools -> solver -> end."""
    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", sdk.ToolNode(TOOLS))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", sdk.tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def graph_input(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the graph's input state: the messages and the operands the tools read."""
    return {"messages": row["messages"], "operands": row["operands"]}


def make_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Questions ``What is A <op> B?`` with exact integer answers."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        word = rng.choice(list(OPERATIONS))
        b = rng.randint(1, 9)
        a = b * rng.randint(1, 9) if word == "/" else rng.randint(1, 9)
        rows.append({
            "id": f"ops-{seed}-{i}",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {a} {word} {b}?"},
            ],
            "operands": [a, b],
            "tool": OPERATIONS[word],
        })
    return rows


def noisy_expert_conversation(
    row: dict[str, Any], rng: random.Random, accuracy: float
) -> list[dict[str, Any]]:
    """Warm-start data from an unreliable expert: right format, right tool with ``accuracy``,
    else a tool picked at random (what RL must fix)."""
    name = row["tool"] if rng.random() < accuracy else rng.choice(list(OPERATIONS.values()))
    result = next(t for t in TOOLS if t.name == name).func(row["operands"])
    call = json.dumps({"name": name, "arguments": {}}, separators=(",", ":"))
    return [
        *row["messages"],
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": f"The answer is {result}."},
    ]


def right_tool_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> float:
    """1 when the first tool the agent called is the one the question asks for."""
    calls = [c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    return float(bool(calls) and calls[0]["name"] == row["tool"])


def training_rows() -> list[dict[str, Any]]:
    """The demo's training questions (for `agentrl train`)."""
    return make_rows(256, seed=2)


def held_out_rows(count: int = 32) -> list[dict[str, Any]]:
    """Questions that are not among `training_rows`: the demo's evaluation set."""
    seen = {r["messages"][-1]["content"] for r in training_rows()}
    fresh = []
    for row in make_rows(1000, seed=7):
        question = row["messages"][-1]["content"]
        if question not in seen:
            seen.add(question)
            fresh.append(row)
    return fresh[:count]
