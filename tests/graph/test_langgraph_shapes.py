"""LangGraph's own agents and documentation shapes, run as rollouts: every call token-exact and
attributed to its node path.

The engine is `RuleEngine` (answers like a small obedient model: tool calls for the user's
words, JSON for a schema), so the graphs take their real control flow. Each test checks the
ids against what the engine was sent and sampled, the masks, and the node path of every call.
"""

from __future__ import annotations

import asyncio
import operator
import warnings
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send
from pydantic import BaseModel

import agentrl_sdk as sdk
from agentrl_sdk import RolloutConfig, TokenChatModel
from agentrl_sdk.models.tokenizers import build_qwen_tokenizer
from agentrl_sdk.types import Trajectory
from tests.chat._rule_engine import RuleEngine


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def search(query: str) -> str:
    """Search the web for a query."""
    return f"3 pages about {query}"


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen_tokenizer("hermes")


@pytest.fixture
def engine(tokenizer):
    return RuleEngine(tokenizer)


def _react_agent(tools: list, name: str | None = None):
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():  # moved to langchain.agents; still LangGraph's own
        warnings.simplefilter("ignore")
        return create_react_agent(TokenChatModel(), tools, name=name)


async def _run(graph, engine, tokenizer, text: str, **config: Any) -> Trajectory:
    rows = [{"id": "r0", "messages": [{"role": "user", "content": text}]}]
    engines = config.pop("engines", engine)
    record = config.pop("record_events", False)
    (traj,) = await sdk.arollout_batch(graph, rows, engines, tokenizer=tokenizer,
                                       config=RolloutConfig(**config), record_events=record)
    assert traj.status == "ok", traj.error
    return traj


def assert_token_exact(traj: Trajectory, engine: RuleEngine) -> None:
    """Every call's ids are what the engine was sent and sampled; every segment is its last
    call's prompt and reply, and trains (mask 1) exactly the ids its calls sampled."""
    for call in traj.calls:
        prompt, result = engine.answered[call.request_id]
        assert call.prompt_ids == prompt
        assert call.response_ids == result.token_ids
        assert call.response_logprobs == result.logprobs
    for index, segment in enumerate(traj.segments):
        calls = [c for c in traj.calls if c.segment_index == index]
        last = calls[-1]
        assert segment.prompt_ids + segment.response_ids == last.prompt_ids + last.response_ids
        assert segment.generated_ids == [i for c in calls for i in c.response_ids]
        assert len(segment.response_mask) == len(segment.response_ids)


def _paths(traj: Trajectory) -> list[str]:
    return [c.node for c in traj.calls]


async def test_create_react_agent(engine, tokenizer):
    traj = await _run(_react_agent([add]), engine, tokenizer, "add 2 and 3")
    assert _paths(traj) == ["agent", "agent"]
    assert_token_exact(traj, engine)
    assert len(traj.segments) == 1  # the tool turn extends the first call's tokens
    assert traj.final_state["messages"][-1].content == "The tool answered: 5."


async def test_langchain_create_agent(engine, tokenizer):
    from langchain.agents import create_agent

    traj = await _run(create_agent(TokenChatModel(), [add]), engine, tokenizer, "add 2 and 3")
    assert _paths(traj) == ["model", "model"]
    assert_token_exact(traj, engine)
    assert traj.final_state["messages"][-1].content == "The tool answered: 5."


def _command_supervisor():
    """LangGraph's documented supervisor: an LLM node that routes with Command(goto=...) to two
    prebuilt worker agents, then ends."""
    order = ["researcher", "coder", END]

    async def supervisor(state: MessagesState) -> Command:
        reply = await TokenChatModel().ainvoke(
            [*state["messages"], HumanMessage("Who works next?")])
        visits = sum(isinstance(m, AIMessage) and m.name == "supervisor"
                     for m in state["messages"])
        return Command(goto=order[visits],
                       update={"messages": [AIMessage(reply.content, name="supervisor")]})

    g = StateGraph(MessagesState)
    g.add_node("supervisor", supervisor, destinations=("researcher", "coder", END))
    g.add_node("researcher", _react_agent([search], "researcher"))
    g.add_node("coder", _react_agent([add], "coder"))
    g.add_edge(START, "supervisor")
    g.add_edge("researcher", "supervisor")
    g.add_edge("coder", "supervisor")
    return g.compile()


async def test_command_supervisor_with_two_prebuilt_workers(engine, tokenizer):
    """The two workers' prebuilt "agent" nodes are told apart by path, and path rules give
    them their own policy (researcher) and freeze one (coder) without touching their code."""
    traj = await _run(
        _command_supervisor(), engine, tokenizer, "search cats then add 2 and 3",
        engines={"default": engine, "researcher": engine},
        nodes={"researcher/*": sdk.trainable(policy="researcher"), "coder/*": sdk.frozen()},
    )
    assert [(c.node, c.policy, c.trained) for c in traj.calls] == [
        ("supervisor", "default", True),
        ("researcher/agent", "researcher", True), ("researcher/agent", "researcher", True),
        ("supervisor", "default", True),
        ("coder/agent", "default", False),  # the history ends in a tool result: it answers
        ("supervisor", "default", True),
    ]
    assert_token_exact(traj, engine)
    assert [(s.node, s.policy, s.trained) for s in traj.segments] == [
        ("supervisor", "default", True), ("researcher/agent", "researcher", True),
        ("supervisor", "default", True), ("coder/agent", "default", False),
        ("supervisor", "default", True),
    ]
    assert {s.started_because for s in traj.segments[1:]} <= {"node_changed", "new_conversation",
                                                               "history_edited"}


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_langgraph_supervisor(engine, tokenizer):
    """langgraph-supervisor: the supervisor is itself a prebuilt agent; handoffs are tools."""
    from langgraph_supervisor import create_supervisor

    researcher = _react_agent([search], "researcher")
    coder = _react_agent([add], "coder")
    graph = create_supervisor([researcher, coder], model=TokenChatModel()).compile()
    traj = await _run(graph, engine, tokenizer, "transfer_to_coder: add 2 and 3",
                      engines={"default": engine, "boss": engine},
                      nodes={"supervisor/*": sdk.trainable("boss", policy="boss")})
    assert [(c.node, c.policy) for c in traj.calls] == [
        ("boss", "boss"), ("coder/agent", "default"), ("boss", "boss")]
    assert_token_exact(traj, engine)


class _Fanout(TypedDict):
    topics: list[str]
    jokes: Annotated[list[str], operator.add]


async def test_send_map_reduce(engine, tokenizer):
    """The documented map-reduce: one Send per topic, the workers' calls run concurrently,
    each in its own segment under the worker's path."""

    async def write(state: dict) -> dict:
        reply = await TokenChatModel().ainvoke(f"Tell a joke about {state['topic']}")
        return {"jokes": [f"{state['topic']}: {reply.content}"]}

    g = StateGraph(_Fanout)
    g.add_node("write", write)
    g.add_conditional_edges(START, lambda s: [Send("write", {"topic": t}) for t in s["topics"]])
    g.add_edge("write", END)
    rows = [{"id": "r0", "topics": ["cats", "dogs", "owls"]}]
    (traj,) = await sdk.arollout_batch(g.compile(), rows, engine, tokenizer=tokenizer,
                                       input_fn=lambda row: {"topics": row["topics"]})
    assert traj.status == "ok", traj.error
    assert _paths(traj) == ["write"] * 3
    assert len(traj.segments) == 3 and len(traj.final_state["jokes"]) == 3
    assert_token_exact(traj, engine)
    prompts = sorted(tokenizer.decode(c.prompt_ids) for c in traj.calls)
    assert [p.count("Tell a joke about") for p in prompts] == [1, 1, 1]


async def test_subgraphs_as_a_node_and_called_from_a_node(engine, tokenizer):
    async def think(state: MessagesState) -> dict:
        return {"messages": [await TokenChatModel().ainvoke(state["messages"])]}

    inner = StateGraph(MessagesState)
    inner.add_node("think", think)
    inner.add_edge(START, "think")
    inner = inner.compile()

    async def wrapper(state: MessagesState) -> dict:
        out = await inner.ainvoke({"messages": state["messages"][:1]})
        return {"messages": out["messages"][-1:]}

    @sdk.trainable("decorated")
    async def decorated(state: MessagesState) -> dict:
        return {"messages": [await TokenChatModel().ainvoke(state["messages"][:1])]}

    g = StateGraph(MessagesState)
    g.add_node("inner", inner)
    g.add_node("wrapper", wrapper)
    g.add_node("decorated", decorated)
    g.add_edge(START, "inner")
    g.add_edge("inner", "wrapper")
    g.add_edge("wrapper", "decorated")
    traj = await _run(g.compile(), engine, tokenizer, "hello")
    # A decorated node keeps its decorator's name, wherever it runs.
    assert _paths(traj) == ["inner/think", "wrapper/think", "decorated"]
    assert_token_exact(traj, engine)


async def test_streaming_nodes_are_attributed_and_traced(engine, tokenizer):
    """A node that streams (async or sync) is attributed to its path and its trace links
    node -> LLM call -> engine call, as an invoked call's does."""

    async def astreamer(state: MessagesState) -> dict:
        chunks = [c async for c in TokenChatModel().astream(state["messages"])]
        return {"messages": [chunks[0]]}

    def streamer(state: MessagesState) -> dict:
        chunks = list(TokenChatModel().stream(state["messages"][:1]))
        return {"messages": [chunks[0]]}

    g = StateGraph(MessagesState)
    g.add_node("astreamer", astreamer)
    g.add_node("streamer", streamer)
    g.add_edge(START, "astreamer")
    g.add_edge("astreamer", "streamer")
    traj = await _run(g.compile(), engine, tokenizer, "hello", record_events=True)
    assert _paths(traj) == ["astreamer", "streamer"]
    assert_token_exact(traj, engine)
    by_id = {e.id: e for e in traj.events}
    for index, node in enumerate(["astreamer", "streamer"]):
        (engine_event,) = [e for e in traj.events
                           if e.kind == "engine" and e.call_index == index]
        llm = by_id[engine_event.parent_id]
        assert llm.kind == "llm" and llm.call_index == index
        assert by_id[llm.parent_id].kind == "node" and by_id[llm.parent_id].name == node


async def test_stream_mode_messages_and_astream_events_v2_show_each_reply(engine, tokenizer):
    """LangGraph's ``stream_mode="messages"`` and LangChain's default ``astream_events``
    (v2) over a graph see each reply as one chunk: a graph streamed inside a rollout's node
    (its call recorded once, token-exact) and a graph its user streams."""

    def graph_of(model: TokenChatModel):
        async def call(state: MessagesState, config) -> dict:
            return {"messages": [await model.ainvoke(state["messages"], config)]}

        g = StateGraph(MessagesState)
        g.add_node("call", call)
        g.add_edge(START, "call")
        return g.compile()

    async def streams(graph, given) -> tuple[list, list]:
        messages = [(chunk.content, meta["langgraph_node"])
                    async for chunk, meta in graph.astream(given, stream_mode="messages")]
        events = [e["data"]["chunk"].content
                  async for e in graph.astream_events(given, version="v2")
                  if e["event"] == "on_chat_model_stream"]  # fmt: skip
        return messages, events

    seen: list = []

    async def streaming_node(state: MessagesState, config) -> dict:
        given = {"messages": state["messages"]}
        messages, events = await streams(graph_of(TokenChatModel()), given)
        seen.append((messages, events))
        return {"messages": [AIMessage(messages[0][0])]}

    g = StateGraph(MessagesState)
    g.add_node("outer", streaming_node)
    g.add_edge(START, "outer")
    traj = await _run(g.compile(), engine, tokenizer, "hello")
    assert len(traj.calls) == 2  # the inner graph ran twice: once per stream
    assert_token_exact(traj, engine)
    replies = [tokenizer.decode(c.response_ids, skip_special_tokens=True) for c in traj.calls]
    assert seen == [([(replies[0], "call")], [replies[1]])] and replies[0]

    own = TokenChatModel(engine=RuleEngine(tokenizer), tokenizer=tokenizer)
    given = {"messages": [("user", "hello")]}
    reply = (await graph_of(own).ainvoke(given))["messages"][-1].content
    assert await streams(graph_of(own), given) == ([(reply, "call")], [reply]) and reply


class Weather(BaseModel):
    city: str
    celsius: int


async def test_structured_output_in_all_three_methods(engine, tokenizer):
    """function_calling forces the schema's tool call (its opening at mask 0); json_schema
    and json_mode read JSON from the reply's text."""
    results: dict[str, Any] = {}

    def node_for(method: str):
        async def node(state: MessagesState) -> dict:
            llm = TokenChatModel().with_structured_output(Weather, method=method)
            results[method] = await llm.ainvoke("Weather in Oslo, 3 degrees?")
            return {}
        return node

    g = StateGraph(MessagesState)
    methods = ["function_calling", "json_schema", "json_mode"]
    previous = START
    for method in methods:
        g.add_node(method, node_for(method))
        g.add_edge(previous, method)
        previous = method
    traj = await _run(g.compile(), engine, tokenizer, "hello")
    assert _paths(traj) == methods
    assert_token_exact(traj, engine)
    # The rule engine fills numbers from the question (strings with a stock word).
    assert isinstance(results["function_calling"], Weather)
    assert results["function_calling"].celsius == 3
    assert results["json_schema"] == results["function_calling"]
    assert results["json_mode"] == results["function_calling"]
    forced = traj.calls[0].forced_ids
    assert tokenizer.decode(forced) == '<tool_call>\n{"name": "Weather", "arguments": '
    assert traj.segments[0].response_mask[: len(forced)] == [0] * len(forced)
    assert [c.forced_ids for c in traj.calls[1:]] == [[], []]


async def test_functional_api_tasks(engine, tokenizer):
    """LangGraph's functional API: an entrypoint running tasks concurrently; each task's
    call sits under the entrypoint's path."""
    from langgraph.func import entrypoint, task

    @task
    async def draft(topic: str) -> str:
        return (await TokenChatModel().ainvoke(f"Write about {topic}")).content

    @entrypoint()
    async def workflow(inputs: dict) -> list:
        return list(await asyncio.gather(*[draft(t) for t in inputs["topics"]]))

    (traj,) = await sdk.arollout_batch(workflow, [{"id": "r0", "topics": ["owls", "cats"]}],
                                       engine, tokenizer=tokenizer, input_fn=dict)
    assert traj.status == "ok", traj.error
    assert _paths(traj) == ["workflow/draft"] * 2 and len(traj.final_state) == 2
    assert_token_exact(traj, engine)
