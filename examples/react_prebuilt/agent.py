"""LangGraph's prebuilt ReAct agent, trained unchanged.

``create_react_agent`` builds the graph (its own "agent" and "tools" nodes, LangGraph's own
ToolNode); we only hand it `sdk.TokenChatModel()` as the model. Inside a rollout that model
takes the engine, tokenizer and token ledger from the rollout, and calls from undecorated
nodes are trained (``rollout.default_trainable``), so nothing in the graph knows about RL.
The task and warm-started policy are the tool-selection example's.
"""

from __future__ import annotations

import warnings
from typing import Any

from langgraph.prebuilt.chat_agent_executor import AgentState

import agentrl_sdk as sdk
from examples.tool_selection.agent import TOOLS


class State(AgentState):
    """The prebuilt agent's state plus the operands the tools read (``InjectedState``)."""

    operands: list[int]


def build_graph() -> Any:
    """The prebuilt ReAct agent over the four arithmetic tools."""
    with warnings.catch_warnings():  # it moved to langchain.agents; the graph is the same
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(sdk.TokenChatModel(), TOOLS, state_schema=State)
