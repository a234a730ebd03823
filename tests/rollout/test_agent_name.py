"""Rows pick their graph by ``agent_name`` (as verl's agent_name picks an agent loop)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph

import agentrl_sdk as sdk
from agentrl_sdk.models import build_small_tokenizer


def _graph(reply: str) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("answer", lambda state: {"messages": [AIMessage(reply)]})
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


async def test_rows_run_the_graph_their_agent_name_names() -> None:
    graphs = {"default": _graph("from default"), "math": _graph("from math")}
    rows = [
        {"id": "a", "prompt": [{"role": "user", "content": "x"}], "agent_name": "math"},
        {"id": "b", "prompt": [{"role": "user", "content": "x"}]},
        {"id": "c", "prompt": [{"role": "user", "content": "x"}], "agent_name": "chess"},
    ]
    math, default, unknown = await sdk.arollout_batch(
        graphs, rows, {}, tokenizer=build_small_tokenizer(), n=1)
    assert math.final_state["messages"][-1].content == "from math"
    assert default.final_state["messages"][-1].content == "from default"
    assert unknown.status == "graph_error" and "no graph for agent_name 'chess'" in unknown.error
