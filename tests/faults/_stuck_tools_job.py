"""A training job whose tools get stuck: ``python -m tests.faults._stuck_tools_job OUT``.

The demo agent's tools, except that every other call of ``add`` (sync) and of ``subtract``
(async) never returns. ``add`` and ``subtract`` sit behind a ToolNode with a 1 s timeout; in
half of the graphs (``agent_name`` ``untimed``) they have none, so only ``rollout.timeout_s``
ends those rollouts. Two tool threads only: stuck calls soon hold them all. The job writes its
history to OUT, then returns: the process must exit on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
from typing import Annotated, Any

from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import InjectedState

import agentrl_sdk as sdk
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import (
    State,
    divide,
    make_rows,
    multiply,
    right_tool_reward,
)
from examples.tool_selection.model import model_path
from examples.tool_selection.train import HERE

_calls = itertools.count()


@tool
def add(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Add the two numbers of the question."""
    if next(_calls) % 2:
        threading.Event().wait()  # stuck for good: holds its thread
    return str(operands[0] + operands[1])


@tool
async def subtract(operands: Annotated[list[int], InjectedState("operands")]) -> str:
    """Subtract the second number of the question from the first."""
    if next(_calls) % 2:
        await asyncio.Event().wait()  # stuck for good
    return str(operands[0] - operands[1])


TOOLS = [add, subtract, multiply, divide]


def build_graph(timeout_s: float | None) -> Any:
    @sdk.trainable("solver")
    async def solver(state: State, config) -> dict:
        llm = sdk.chat_model(config).bind_tools(TOOLS)
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", sdk.ToolNode(TOOLS, timeout_s=timeout_s))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", sdk.tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def main(out: str) -> None:
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.model.path = str(model_path(progress=False))
    config.max_steps = 3
    config.evaluation.every = 0
    config.data.batch_size = 4
    config.rollout.n = 4
    config.rollout.timeout_s = 8.0
    config.rollout.tool_threads = 2
    config.checkpoint.dir = None
    config.tracking.enabled = False
    rows = [{**row, "agent_name": "untimed" if i % 2 else "default"}
            for i, row in enumerate(make_rows(64, seed=3))]
    graphs = {"default": build_graph(1.0), "untimed": build_graph(None)}
    result = sdk.train(graphs, rows, reward=right_tool_reward, config=config,
                       input_fn=lambda row: {"messages": row["messages"],
                                             "operands": row["operands"]})
    with open(out, "w") as f:
        json.dump(result.history, f)


if __name__ == "__main__":
    main(sys.argv[1])
