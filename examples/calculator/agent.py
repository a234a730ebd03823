"""A LangGraph calculator agent: a trainable solver node that calls a safe calculator tool."""

from __future__ import annotations

import json
import random
from typing import Annotated, Any, TypedDict

from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

import agentrl_sdk as sdk
from examples.calculator.calculator import calculate

SYSTEM = "You are a calculator agent. Use the calculator tool, then give the answer."


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as (2+3)*4."""
    value = calculate(expression)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class State(TypedDict):
    messages: Annotated[list, add_messages]


def react_graph(tools: list[Any]) -> Any:
    """solver -> (tools -> solver)* -> end: an ordinary LangGraph ReAct loop over ``tools``,
    its solver node trainable."""

    @sdk.trainable("solver")
    async def solver(state: State, config) -> dict:
        """Ask the policy for the next step: a tool call or the final answer."""
        llm = sdk.chat_model(config).bind_tools(tools)
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", sdk.ToolNode(tools))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", sdk.tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def build_graph() -> Any:
    """The calculator agent: the ReAct loop with the safe calculator tool."""
    return react_graph([calculator])


def make_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Two-step problems ``(a+b)*c``: three LLM turns when solved with the tool."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(2, 9)
        rows.append({
            "id": f"calc-{seed}-{i}",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is ({a}+{b})*{c}?"},
            ],
            "operands": [a, b, c],
            "answer": str((a + b) * c),
        })
    return rows


def _call(expression: str) -> str:
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}},
                      separators=(",", ":"))
    return f"<tool_call>\n{body}\n</tool_call>"


def expert_conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    """How a competent agent solves ``row``: compact-JSON calls, then the answer."""
    a, b, c = row["operands"]
    return [
        *row["messages"],
        {"role": "assistant", "content": _call(f"{a}+{b}")},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": _call(f"{a + b}*{c}")},
        {"role": "tool", "content": str((a + b) * c)},
        {"role": "assistant", "content": f"The answer is {(a + b) * c}."},
    ]
