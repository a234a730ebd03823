"""The RL tool lifecycle in real LangGraph rollouts: create -> execute* -> calc_reward -> release.

The "model" node here is scripted (it writes tool calls directly): what is under test is the
tool lifecycle, the runner and `sdk.ToolNode`, not the LLM.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import BaseModel

import agentrl_sdk as sdk
from agentrl_sdk.models import build_small_tokenizer


class _Args(BaseModel):
    x: int


class Recording(sdk.RLTool):
    """Logs every lifecycle call; its reward is the sum of the x it saw plus its offset."""

    name: str = "rec"
    description: str = "records calls"
    args_schema: type[BaseModel] = _Args
    log: list[tuple[str, Any]] = []
    sleep_s: float = 0.0
    fail_on: int | None = None
    barrier: Any = None

    async def create(self, **kwargs: Any) -> dict[str, Any]:
        self.log.append(("create", kwargs))
        return {"seen": [], **kwargs}

    async def execute(self, instance: dict[str, Any], **arguments: Any) -> str:
        self.log.append(("execute", arguments))
        if self.barrier is not None:  # every parallel call must be running at once to pass
            self.barrier.append(arguments["x"])
            await asyncio.wait_for(self._all_arrived(), timeout=5)
        await asyncio.sleep(self.sleep_s)
        if arguments["x"] == self.fail_on:
            raise RuntimeError("boom")
        instance["seen"].append(arguments["x"])
        return f"ok {arguments['x']}"

    async def _all_arrived(self) -> None:
        while len(self.barrier) < 2:
            await asyncio.sleep(0.001)

    async def calc_reward(self, instance: dict[str, Any], **kwargs: Any) -> float:
        self.log.append(("calc_reward", kwargs))
        return float(sum(instance["seen"]) + instance.get("offset", 0))

    async def release(self, instance: dict[str, Any], **kwargs: Any) -> None:
        self.log.append(("release", kwargs))


def _graph(tool: sdk.RLTool, calls: list[list[int]], *, crash: bool = False) -> Any:
    """Scripted model turns: each writes the given x values as parallel tool calls."""

    def model(state: MessagesState) -> dict[str, Any]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        if turn >= len(calls):
            if crash:
                raise RuntimeError("graph bug after the tools ran")
            return {"messages": [AIMessage("done")]}
        tool_calls = [{"name": tool.name, "args": {"x": x}, "id": f"c{turn}{i}"}
                      for i, x in enumerate(calls[turn])]
        return {"messages": [AIMessage("", tool_calls=tool_calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", sdk.ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", sdk.tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def _row(**tool_kwargs: Any) -> dict[str, Any]:
    return {"id": "r0", "prompt": [{"role": "user", "content": "go"}],
            "extra_info": {"tools_kwargs": {"rec": tool_kwargs}}}


async def _rollout(graph: Any, row: dict[str, Any]) -> sdk.Trajectory:
    # No LLM call happens, so no engine is given.
    [trajectory] = await sdk.arollout(graph, row, {}, tokenizer=build_small_tokenizer(), n=1)
    return trajectory


async def test_lifecycle_order_with_per_row_kwargs() -> None:
    tool = Recording(log=[])
    row = _row(create_kwargs={"offset": 100}, execute_kwargs={"secret": 7},
               calc_reward_kwargs={"scale": 1}, release_kwargs={"why": "done"})
    trajectory = await _rollout(_graph(tool, [[1], [2, 3]]), row)

    assert trajectory.status == "ok", trajectory.error
    assert [event for event, _ in tool.log] == [
        "create", "execute", "execute", "execute", "calc_reward", "release"]
    assert tool.log[0] == ("create", {"offset": 100})
    assert all(kw["secret"] == 7 for event, kw in tool.log if event == "execute")
    assert tool.log[-2:] == [("calc_reward", {"scale": 1}), ("release", {"why": "done"})]
    assert trajectory.rewards == {"tool/rec": 106.0}
    assert trajectory.metrics["tools_created"] == 1 and trajectory.metrics["tools_released"] == 1


async def test_release_runs_when_the_graph_fails() -> None:
    tool = Recording(log=[])
    trajectory = await _rollout(_graph(tool, [[4]], crash=True), _row())
    assert trajectory.status == "graph_error"
    assert [event for event, _ in tool.log] == ["create", "execute", "calc_reward", "release"]


async def test_timeouts_and_exceptions_become_counted_tool_messages() -> None:
    tool = Recording(log=[], sleep_s=0.5, timeout_s=0.05)
    trajectory = await _rollout(_graph(tool, [[1]]), _row())
    assert trajectory.status == "ok"
    [reply] = [m for m in trajectory.final_state["messages"] if isinstance(m, ToolMessage)]
    assert reply.status == "error" and "timed out after 0.05 s" in reply.content
    assert trajectory.metrics["tool_timeouts"] == 1 and trajectory.metrics["tool_errors"] == 1

    tool = Recording(log=[], fail_on=2)
    trajectory = await _rollout(_graph(tool, [[1, 2]]), _row())
    replies = [m for m in trajectory.final_state["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in replies] == ["success", "error"]
    assert "boom" in replies[1].content and trajectory.metrics["tool_errors"] == 1
    assert trajectory.rewards == {"tool/rec": 1.0}  # the call that worked still counts


async def test_parallel_calls_run_concurrently_on_one_instance() -> None:
    tool = Recording(log=[], barrier=[])  # each call waits until both calls are running
    trajectory = await _rollout(_graph(tool, [[5, 6]]), _row())
    assert trajectory.status == "ok", trajectory.error
    assert sorted(tool.barrier) == [5, 6] and trajectory.rewards == {"tool/rec": 11.0}
    assert [event for event, _ in tool.log].count("create") == 1


async def test_bad_reward_is_counted_and_release_still_runs() -> None:
    class NaNReward(Recording):
        async def calc_reward(self, instance: dict[str, Any], **kwargs: Any) -> float:
            return float("nan")

    tool = NaNReward(log=[])
    trajectory = await _rollout(_graph(tool, [[1]]), _row())
    assert trajectory.rewards == {} and trajectory.metrics["tool_reward_errors"] == 1
    assert tool.log[-1][0] == "release"


async def test_outside_a_rollout_each_call_gets_its_own_instance() -> None:
    tool = Recording(log=[])
    assert await tool.ainvoke({"x": 3}) == "ok 3"
    assert [event for event, _ in tool.log] == ["create", "execute", "calc_reward", "release"]
    with pytest.raises(NotImplementedError, match="ainvoke"):
        tool.invoke({"x": 3})


async def test_plain_function_tools_time_out_into_counted_error_messages() -> None:
    import time

    from langchain_core.tools import tool

    @tool
    def slow(x: int) -> str:
        """Sleeps (a hung API)."""
        time.sleep(0.5)
        return "late"

    @tool
    async def fast(x: int) -> str:
        """Answers at once."""
        return f"fast {x}"

    def model(state: MessagesState) -> dict[str, Any]:
        if len(state["messages"]) > 1:
            return {"messages": [AIMessage("done")]}
        calls = [{"name": "slow", "args": {"x": 1}, "id": "a"},
                 {"name": "fast", "args": {"x": 2}, "id": "b"}]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", sdk.ToolNode([slow, fast], timeout_s=0.05))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", sdk.tools_condition)
    graph.add_edge("tools", "model")
    trajectory = await _rollout(graph.compile(), _row())

    slow_reply, fast_reply = [m for m in trajectory.final_state["messages"]
                              if isinstance(m, ToolMessage)]
    assert slow_reply.status == "error" and "timed out after 0.05 s" in slow_reply.content
    assert fast_reply.content == "fast 2"
    assert trajectory.metrics["tool_timeouts"] == 1 and trajectory.metrics["tool_errors"] == 1
