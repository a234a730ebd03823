"""A benchmark agent with a long tail: rows ask for 1 to 6 LLM calls of a few to many tokens, and
every call but the last is followed by a tool that waits ``latency_s`` (an API, a sandbox)."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import agentrl_sdk as sdk
from examples.tool_selection.agent import make_rows


class State(TypedDict):
    messages: Annotated[list, add_messages]
    calls: int
    max_tokens: int


@sdk.trainable("agent")
async def agent(state: State, config) -> dict:
    """One LLM call of at most the row's ``max_tokens``."""
    llm = sdk.chat_model(config, max_tokens=state["max_tokens"])
    return {"messages": [await llm.ainvoke(state["messages"])]}


def build_graph(latency_s: float) -> Any:
    """agent -> (tool -> agent) * (calls - 1) -> end; the tool waits ``latency_s``."""

    async def tool(state: State) -> dict:
        await asyncio.sleep(latency_s)
        return {"messages": [HumanMessage("The tool answered: ok. Go on.")]}

    def route(state: State) -> str:
        made = sum(isinstance(m, AIMessage) for m in state["messages"])
        return "tool" if made < state["calls"] else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tool", tool)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tool", END])
    graph.add_edge("tool", "agent")
    return graph.compile()


def long_tail_rows(
    count: int, seed: int = 0, *, calls: int | None = None, max_tokens: int = 48,
    median_tokens: float = 10.0,
) -> list[dict[str, Any]]:
    """The demo's questions, each with a long-tailed token budget per call (lognormal around
    ``median_tokens``, capped at ``max_tokens``) and number of calls (1, 2 or 6; or exactly
    ``calls``)."""
    rng = random.Random(seed)
    rows = make_rows(count, seed=seed)
    for row in rows:
        row["calls"] = calls or rng.choices([1, 2, 6], weights=[6, 3, 1])[0]
        budget = rng.lognormvariate(math.log(median_tokens), 0.9)
        row["max_tokens"] = min(max_tokens, max(4, int(budget)))
    return rows


def graph_input(row: dict[str, Any]) -> dict[str, Any]:
    """The row's messages and its call and token budget."""
    return {"messages": row["messages"], "calls": row["calls"], "max_tokens": row["max_tokens"]}


def answer_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> float:
    """1 when the last answer mentions the question's tool (a signal that varies in a group)."""
    last = state["messages"][-1]
    return float(row["tool"] in str(last.content))
