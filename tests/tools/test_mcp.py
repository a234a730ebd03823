"""MCP tools from a local MCP server (started by the test) run in a rollout's `sdk.ToolNode`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph

import agentrl_sdk as sdk
from agentrl_sdk.models import build_small_tokenizer

from agentrl_sdk.tools.mcp import load_mcp_tools

SERVER = Path(__file__).with_name("mcp_calc_server.py")


def _graph(tools: list[Any], calls: list[dict[str, Any]]) -> Any:
    """A scripted model turn with ``calls`` (the tools and the runner are under test)."""

    def model(state: MessagesState) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", sdk.ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", sdk.tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


@pytest.mark.slow
async def test_mcp_server_tools_run_in_a_rollout() -> None:
    tools = await load_mcp_tools(sys.executable, [str(SERVER)])
    assert sorted(t.name for t in tools) == ["add", "divide"]

    calls = [
        {"name": "add", "args": {"a": 2, "b": 40}, "id": "c1"},
        {"name": "divide", "args": {"a": 1, "b": 0}, "id": "c2"},
    ]
    row = {"id": "m", "prompt": [{"role": "user", "content": "compute"}]}
    [trajectory] = await sdk.arollout(_graph(tools, calls), row, {},
                                      tokenizer=build_small_tokenizer(), n=1)

    assert trajectory.status == "ok", trajectory.error
    add, divide = [m for m in trajectory.final_state["messages"] if isinstance(m, ToolMessage)]
    assert add.status == "success" and "42" in str(add.content)
    assert divide.status == "error" and "division by zero" in str(divide.content)
    assert trajectory.metrics["tool_errors"] == 1
