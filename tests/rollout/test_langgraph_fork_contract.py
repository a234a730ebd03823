"""What tree rollouts build on, pinned against LangGraph itself: a compiled graph copied with a
checkpointer stops after a chosen node (``interrupt_after``), and several runs resumed from
that checkpoint at once go on independently from the state the graph saved there."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    turn: int


def build(choices: dict[str, list[str]]):
    """An agent loop: ``llm`` picks its next word from ``choices[thread]`` (one per call)."""

    async def llm(state: State, config) -> dict:
        await asyncio.sleep(0)  # the forks interleave
        word = choices[config["configurable"]["fork"]].pop(0)
        return {"log": [word], "turn": state["turn"] + 1}

    async def tool(state: State) -> dict:
        return {"log": [f"result of {state['log'][-1]}"]}

    graph = StateGraph(State)
    graph.add_node("llm", llm)
    graph.add_node("tool", tool)
    graph.add_edge(START, "llm")
    graph.add_conditional_edges("llm", lambda s: "tool" if s["turn"] < 2 else END)
    graph.add_edge("tool", "llm")
    return graph.compile()


async def test_forks_resume_from_the_saved_state_after_a_tool_and_go_their_own_ways():
    choices = {"root": ["search"], "a": ["answer 1"], "b": ["answer 2"]}
    saver = InMemorySaver()
    forkable = build(choices).copy(update={"checkpointer": saver})
    root = {"configurable": {"thread_id": "rollout-0", "fork": "root"}}
    stopped = await forkable.ainvoke({"log": [], "turn": 0}, root, interrupt_after=["tool"])
    assert stopped == {"log": ["search", "result of search"], "turn": 1}
    branch_point = await forkable.aget_state(root)
    assert branch_point.next == ("llm",)

    async def fork(name: str) -> dict:
        config = {"configurable": {**branch_point.config["configurable"], "fork": name}}
        return await forkable.ainvoke(None, config)

    a, b = await asyncio.gather(fork("a"), fork("b"))
    assert a == {"log": ["search", "result of search", "answer 1"], "turn": 2}
    assert b == {"log": ["search", "result of search", "answer 2"], "turn": 2}
    # Each resume opens a "fork" checkpoint off the branch point: the thread holds a tree.
    saved = [c async for c in saver.alist({"configurable": {"thread_id": "rollout-0"}})]
    forks = [c for c in saved if c.metadata["source"] == "fork"]
    point = branch_point.config["configurable"]["checkpoint_id"]
    assert [c.parent_config["configurable"]["checkpoint_id"] for c in forks] == [point] * 2
    ends = sorted(c.checkpoint["channel_values"]["log"][-1] for c in saved
                  if c.metadata["step"] == 4)  # fmt: skip
    assert ends == ["answer 1", "answer 2"]
