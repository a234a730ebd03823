"""Real LangGraph graphs through `sdk.arollout`: attribution, tool errors, statuses.

The engine here is scripted (replies fixed in advance) so each test pins exact ids; the
same graphs run on the real TorchEngine in tests/rollout/.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode as PrebuiltToolNode
from langgraph.prebuilt import create_react_agent
from langgraph.prebuilt import tools_condition as prebuilt_tools_condition

import agentrl_sdk as sdk
from agentrl_sdk import RolloutConfig
from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.config import ChatConfig


class State(TypedDict):
    messages: Annotated[list, add_messages]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def explode(x: int) -> int:
    """A tool that always fails."""
    raise RuntimeError("boom")


async def _slow_sub(a: int, b: int) -> int:
    return a - b


sub = StructuredTool.from_function(
    func=lambda a, b: a - b, coroutine=_slow_sub, name="sub", description="Subtract b from a."
)

TOOLS = [add, mul, explode, sub]


def call(name: str, **args) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, separators=(",", ":")) + "\n</tool_call>"


def tool_graph(node_fn=None, tool_node=None, condition=None):
    @sdk.trainable("solver")
    async def solver(state, config):
        llm = sdk.chat_model(config).bind_tools(TOOLS)
        return {"messages": [await llm.ainvoke(state["messages"])]}

    g = StateGraph(State)
    g.add_node("solver", node_fn or solver)
    g.add_node("tools", tool_node or sdk.ToolNode(TOOLS))
    g.add_edge(START, "solver")
    g.add_conditional_edges("solver", condition or sdk.tools_condition)
    g.add_edge("tools", "solver")
    return g.compile()


ROW = {"id": "r1", "messages": [{"role": "user", "content": "What is (2+3)*4?"}]}


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


async def test_three_turn_tool_graph_is_token_exact(qwen_tokenizer, scripted):
    replies = [call("add", a=2, b=3), call("mul", a=5, b=4), "The answer is 20."]
    engine = scripted(qwen_tokenizer, replies)
    (traj,) = await sdk.arollout(tool_graph(), ROW, engine, tokenizer=qwen_tokenizer)

    assert traj.status == "ok", traj.error
    (seg,) = traj.segments
    expected = [i for r in replies for i in _ids(qwen_tokenizer, r)]
    assert seg.generated_ids == expected
    assert len(seg.response_logprobs) == len(seg.response_ids) == len(seg.response_mask)
    observed = [t for t, m in zip(seg.response_ids, seg.response_mask) if not m]
    text = qwen_tokenizer.decode(observed)
    assert "<tool_response>\n5\n</tool_response>" in text
    assert "<tool_response>\n20\n</tool_response>" in text
    assert [c.turn for c in traj.calls] == [0, 1, 2]
    assert [c.node for c in traj.calls] == ["solver"] * 3
    # Every call's prompt is the segment so far: the engine saw exactly the ledger.
    for call_, prompt in zip(traj.calls, engine.prompts):
        assert call_.prompt_ids == prompt
        assert (seg.prompt_ids + seg.response_ids)[: len(prompt)] == prompt
    assert traj.final_state["messages"][-1].content == "The answer is 20."
    assert traj.metrics["tool_calls"] == 2


async def test_malformed_unknown_and_failing_calls_go_back_to_the_model(qwen_tokenizer, scripted):
    replies = [
        '<tool_call>\n{"name":"add","arguments":{"a":2,}}\n</tool_call>',
        call("divide", a=1, b=2),
        call("explode", x=1),
        "I give up.",
    ]
    engine = scripted(qwen_tokenizer, replies)
    (traj,) = await sdk.arollout(tool_graph(), ROW, engine, tokenizer=qwen_tokenizer)

    assert traj.status == "ok", traj.error
    assert len(traj.calls) == 4
    assert traj.metrics["malformed_tool_calls"] == 1
    assert traj.metrics["tool_errors"] == 3
    prompts = [qwen_tokenizer.decode(p) for p in engine.prompts]
    assert "malformed tool call" in prompts[1]
    assert "divide is not a valid tool" in prompts[2]
    assert "boom" in prompts[3]
    assert len(traj.segments) == 1


async def test_parallel_and_async_tool_calls(qwen_tokenizer, scripted):
    replies = [call("add", a=2, b=3) + "\n" + call("sub", a=9, b=4), "5 and 5."]
    engine = scripted(qwen_tokenizer, replies)
    (traj,) = await sdk.arollout(tool_graph(), ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    second = qwen_tokenizer.decode(engine.prompts[1])
    assert second.endswith(
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n5\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(traj.segments) == 1


async def test_graph_exception_and_context_budget_are_statuses(qwen_tokenizer, scripted):
    @sdk.trainable("solver")
    async def broken(state, config):
        await sdk.chat_model(config).ainvoke(state["messages"])
        raise ValueError("node bug")

    engine = scripted(qwen_tokenizer, ["x"])
    (traj,) = await sdk.arollout(tool_graph(node_fn=broken), ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "graph_error"
    assert "ValueError: node bug" in traj.error
    assert len(traj.segments) == 1  # what ran before the error is kept

    engine = scripted(qwen_tokenizer, [call("add", a=2, b=3), "never"])
    template = sdk.ChatTemplate(qwen_tokenizer)
    first_prompt = len(
        template.encode(
            template.render(ROW["messages"], to_openai_tools(TOOLS), add_generation_prompt=True)
        )
    )
    # Room for the first call and its reply, not for the tool result after it.
    reply = len(_ids(qwen_tokenizer, call("add", a=2, b=3)))
    tight = RolloutConfig(
        chat=ChatConfig(max_context_tokens=first_prompt + reply + 2),
        sampling=sdk.SamplingParams(max_tokens=32),
    )
    (traj,) = await sdk.arollout(tool_graph(), ROW, engine, tokenizer=qwen_tokenizer, config=tight)
    assert traj.status == "context_exceeded", traj.error
    assert "context budget" in traj.error
    assert len(traj.calls) == 1


async def test_two_trainable_nodes_and_a_frozen_one_are_attributed(qwen_tokenizer, scripted):
    @sdk.trainable("planner", policy="planner")
    async def planner(state, config):
        msg = await sdk.chat_model(config).ainvoke(
            [{"role": "system", "content": "Plan."}, *state["messages"]]
        )
        return {"messages": [msg]}

    @sdk.trainable
    def solver(state):  # sync node, sync invoke
        msg = sdk.chat_model().invoke([{"role": "system", "content": "Solve."}, *state["messages"]])
        return {"messages": [msg]}

    @sdk.frozen("critic")
    async def critic(state, config):
        msg = await sdk.chat_model(config).ainvoke(
            [{"role": "system", "content": "Judge."}, *state["messages"]]
        )
        return {"messages": [msg]}

    g = StateGraph(State)
    for fn in (planner, solver, critic):
        g.add_node(fn.__agentrl_node__.name, fn)
    g.add_edge(START, "planner")
    g.add_edge("planner", "solver")
    g.add_edge("solver", "critic")
    g.add_edge("critic", END)
    engine = scripted(qwen_tokenizer, ["step 1", "20", "correct"])
    engines = {"planner": engine, "default": engine}
    (traj,) = await sdk.arollout(g.compile(), ROW, engines, tokenizer=qwen_tokenizer)

    assert traj.status == "ok", traj.error
    got = [(s.node, s.policy, s.trained, s.started_because) for s in traj.segments]
    assert got == [
        ("planner", "planner", True, "first_call"),
        ("solver", "default", True, "new_conversation"),
        ("critic", "default", False, "new_conversation"),
    ]
    assert [qwen_tokenizer.decode(s.generated_ids) for s in traj.segments] == [
        "step 1<|im_end|>", "20<|im_end|>", "correct<|im_end|>",
    ]
    assert [s.node for s in traj.trained_segments] == ["planner", "solver"]


async def test_subgraph_and_parallel_branches_keep_their_node(qwen_tokenizer, scripted):
    @sdk.trainable("inner")
    async def inner(state, config):
        return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}

    sg = StateGraph(State)
    sg.add_node("inner", inner)
    sg.add_edge(START, "inner")
    sub_graph = sg.compile()

    @sdk.frozen("side")
    async def side(state, config):
        await sdk.chat_model(config).ainvoke([HumanMessage("side question")])
        return {}

    g = StateGraph(State)
    g.add_node("sub", sub_graph)
    g.add_node("side", side)
    g.add_edge(START, "sub")
    g.add_edge(START, "side")
    g.add_edge("sub", END)
    g.add_edge("side", END)
    engine = scripted(qwen_tokenizer, ["a", "b"])
    (traj,) = await sdk.arollout(g.compile(), ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    by_node = {s.node: s for s in traj.segments}
    assert set(by_node) == {"inner", "side"}
    assert by_node["inner"].trained and not by_node["side"].trained
    assert "side question" in qwen_tokenizer.decode(by_node["side"].prompt_ids)


async def test_prebuilt_react_agent_trains_unchanged(qwen_tokenizer, scripted):
    agent = create_react_agent(sdk.TokenChatModel(), [add, mul])
    engine = scripted(qwen_tokenizer, [call("add", a=2, b=3), "5"])
    (traj,) = await sdk.arollout(agent, ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    (seg,) = traj.segments
    assert (seg.node, seg.trained, seg.num_calls) == ("agent", True, 2)
    assert isinstance(traj.final_state["messages"][-1], AIMessage)


async def test_prebuilt_tool_node_and_condition_work(qwen_tokenizer, scripted):
    graph = tool_graph(tool_node=PrebuiltToolNode([add, mul]), condition=prebuilt_tools_condition)
    engine = scripted(qwen_tokenizer, [call("add", a=2, b=3), "5"])
    (traj,) = await sdk.arollout(graph, ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "ok"
    assert len(traj.calls) == 2 and len(traj.segments) == 1


async def test_nodes_emit_named_rewards_crediting_nodes_and_calls(qwen_tokenizer, scripted):
    import numpy as np

    @sdk.trainable("solver")
    async def solver(state, config):
        msg = await sdk.chat_model(config).ainvoke(state["messages"])
        sdk.emit_reward(0.25)  # credits the emitting node
        sdk.emit_reward(np.float32(0.5), name="format", step=-1)  # its call just made
        sdk.emit_reward(0.25)
        sdk.emit_reward(1, name="team", node=None)  # the shared outcome
        return {"messages": [msg]}

    async def judge(state, config):  # an undecorated node names the one it credits
        sdk.emit_reward(True, name="judged", node="solver")
        sdk.emit_reward(0.125, name="plain")  # credits the LangGraph node it runs in
        return {}

    g = StateGraph(State)
    g.add_node("solver", solver)
    g.add_node("judge", judge)
    g.add_edge(START, "solver")
    g.add_edge("solver", "judge")
    engine = scripted(qwen_tokenizer, ["ok"])
    (traj,) = await sdk.arollout(g.compile(), ROW, engine, tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    assert traj.rewards == {"solver": 0.5, "format": 0.5, "team": 1.0, "judged": 1.0,
                            "plain": 0.125}  # totals by name
    assert [(c.name, c.value, c.node, c.step) for c in traj.components] == [
        ("solver", 0.25, "solver", None), ("format", 0.5, "solver", 0),
        ("solver", 0.25, "solver", None), ("team", 1.0, None, None),
        ("judged", 1.0, "solver", None), ("plain", 0.125, "judge", None)]
    sdk.emit_reward(1.0)  # outside a rollout: a no-op, graphs run unchanged in production


async def test_a_reward_in_a_subgraph_credits_the_node_path_its_calls_have(qwen_tokenizer,
                                                                            scripted):
    async def agent(state, config):  # undecorated: attributed by its graph path
        msg = await sdk.chat_model(config).ainvoke(state["messages"])
        sdk.emit_reward(1.0, name="done")
        return {"messages": [msg]}

    inner = StateGraph(State)
    inner.add_node("agent", agent)
    inner.add_edge(START, "agent")
    outer = StateGraph(State)
    outer.add_node("researcher", inner.compile())
    outer.add_edge(START, "researcher")
    (traj,) = await sdk.arollout(outer.compile(), ROW, scripted(qwen_tokenizer, ["ok"]),
                                 tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    assert [c.node for c in traj.calls] == ["researcher/agent"]
    assert [(c.name, c.value, c.node) for c in traj.components] == [
        ("done", 1.0, "researcher/agent")]


async def test_emit_reward_refuses_non_numbers_and_calls_not_made(qwen_tokenizer, scripted):
    @sdk.trainable("solver")
    async def solver(state, config):
        with pytest.raises(ValueError, match="not a finite number"):
            sdk.emit_reward("1")
        with pytest.raises(ValueError, match="credits no LLM call"):
            sdk.emit_reward(1.0, step=0)  # no call made yet
        return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}

    g = StateGraph(State)
    g.add_node("solver", solver)
    g.add_edge(START, "solver")
    (traj,) = await sdk.arollout(g.compile(), ROW, scripted(qwen_tokenizer, ["ok"]),
                                 tokenizer=qwen_tokenizer)
    assert traj.status == "ok", traj.error
    assert traj.rewards == {}


async def test_a_checkpointer_graph_gets_a_fresh_thread_per_rollout(qwen_tokenizer, scripted):
    from langgraph.checkpoint.memory import InMemorySaver

    seen_tenants = []

    @sdk.trainable("solver")
    async def solver(state, config):
        seen_tenants.append(config["configurable"]["tenant"])
        return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}

    g = StateGraph(State)
    g.add_node("solver", solver)
    g.add_edge(START, "solver")
    g.add_edge("solver", END)
    graph = g.compile(checkpointer=InMemorySaver())  # needs a thread_id on every run
    engine = scripted(qwen_tokenizer, ["a", "b", "c", "d"])
    config = RolloutConfig(configurable={"tenant": "acme"})
    for _ in range(2):  # the same row again: the saver must not hand back the last state
        trajs = await sdk.arollout(graph, ROW, engine, tokenizer=qwen_tokenizer, n=2,
                                   config=config)
        for traj in trajs:
            assert traj.status == "ok", traj.error
            assert len(traj.final_state["messages"]) == 2  # the question and one reply
            assert len(traj.calls) == 1 and traj.calls[0].prompt_ids == trajs[0].calls[0].prompt_ids
    assert seen_tenants == ["acme"] * 4
