"""TokenChatModel as a LangChain chat model: tools, parsing, limits (scripted engine, real tokenizer)."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from agentrl_sdk import ChatConfig, ContextBudgetExceeded, NoEngineError, TokenChatModel
from agentrl_sdk.chat import ChatTemplate
from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.errors import EngineError


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Weather(BaseModel):
    """Weather report for a city."""

    city: str = Field(description="City name")
    celsius: int


def _model(tokenizer, engine, **kw) -> TokenChatModel:
    return TokenChatModel(engine=engine, tokenizer=tokenizer, **kw)


async def test_tool_calls_are_parsed_from_generated_ids(qwen_tokenizer, scripted):
    engine = scripted(
        qwen_tokenizer,
        ['Sure.\n<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'],
    )
    llm = _model(qwen_tokenizer, engine).bind_tools([add])
    msg = await llm.ainvoke([HumanMessage("2+3?")])

    assert isinstance(msg, AIMessage)
    assert msg.content == "Sure."
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert msg.tool_calls[0]["id"].startswith("call_")
    prompt = qwen_tokenizer.decode(engine.prompts[0])
    assert '"name": "add"' in prompt and "<tools>" in prompt
    assert msg.usage_metadata["input_tokens"] == len(engine.prompts[0])
    assert msg.response_metadata["finish_reason"] == "stop"


async def test_malformed_call_becomes_invalid_tool_call(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ['<tool_call>\n{"name": "add", "arguments": {a: 2}\n</tool_call>'])
    msg = await _model(qwen_tokenizer, engine).bind_tools([add]).ainvoke("2+3?")
    assert msg.tool_calls == []
    (bad,) = msg.invalid_tool_calls
    assert bad["name"] == "add"
    assert "not valid JSON" in bad["error"]


def test_sync_invoke_and_batch(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["one", "two", "three"])
    llm = _model(qwen_tokenizer, engine)
    assert llm.invoke("hi").content == "one"
    # batch runs its inputs concurrently: the scripted replies go out in arrival order.
    assert sorted(m.content for m in llm.batch(["a", "b"])) == ["three", "two"]


async def test_bind_tools_accepts_pydantic_and_dicts(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["ok"])
    schema = {"type": "function", "function": {"name": "noop", "description": "Nothing.",
                                               "parameters": {"type": "object", "properties": {}}}}
    await _model(qwen_tokenizer, engine).bind_tools([Weather, schema, add]).ainvoke("x")
    prompt = qwen_tokenizer.decode(engine.prompts[0])
    for name in ('"name": "Weather"', '"name": "noop"', '"name": "add"'):
        assert name in prompt


async def test_structured_output_through_tool_calling(qwen_tokenizer, scripted):
    # LangChain binds the schema as the forced tool: the SDK opens the call, the model
    # writes the arguments.
    engine = scripted(qwen_tokenizer, ['{"city":"Oslo","celsius":-3}}\n</tool_call>'])
    out = await _model(qwen_tokenizer, engine).with_structured_output(Weather).ainvoke("Oslo?")
    assert out == Weather(city="Oslo", celsius=-3)
    assert qwen_tokenizer.decode(engine.prompts[0]).endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "Weather", "arguments": ')


async def test_context_budget_raises_before_calling_engine(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["never"])
    llm = _model(qwen_tokenizer, engine, chat=ChatConfig(max_context_tokens=16))
    with pytest.raises(ContextBudgetExceeded, match="context budget of 16"):
        await llm.ainvoke([SystemMessage("long " * 20), HumanMessage("hi")])
    assert engine.prompts == []


async def test_an_engine_that_never_answers_fails_the_call_after_the_timeout(
    qwen_tokenizer, scripted
):
    engine = scripted(qwen_tokenizer, ["hello"])
    answered = engine.generate

    async def first_hangs(prompt_ids, sampling, request_id, *, session_id=None):
        if len(engine.prompts) == 0 and not hung:
            hung.append(request_id)
            await asyncio.Event().wait()  # never set
        return await answered(prompt_ids, sampling, request_id, session_id=session_id)

    hung: list[str] = []
    engine.generate = first_hangs
    template = ChatTemplate(qwen_tokenizer)
    recorder = RolloutRecorder(engine, template, chat=ChatConfig(request_timeout_s=0.2))
    token = current_recorder.set(recorder)
    try:
        with pytest.raises(EngineError, match="no answer to rollout-0 within 0.2s"):
            await TokenChatModel().ainvoke("hi")
        assert recorder.metrics["engine_timeouts"] == 1 and recorder.ledger.calls == []
        reply = await TokenChatModel().ainvoke("hi")  # the ledger was released: a fresh call
    finally:
        current_recorder.reset(token)
    assert reply.content == "hello" and len(recorder.ledger.calls) == 1


async def test_max_tokens_shrinks_to_the_room_left(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["hello there friend"])
    template = ChatTemplate(qwen_tokenizer)
    prompt_len = len(template.encode(template.render([{"role": "user", "content": "hi"}],
                                                      add_generation_prompt=True)))
    llm = _model(qwen_tokenizer, engine, chat=ChatConfig(max_context_tokens=prompt_len + 2))
    msg = await llm.ainvoke("hi")
    assert engine.requests[0][1].max_tokens == 2
    assert msg.usage_metadata["output_tokens"] == 2


async def test_observations_are_truncated_by_tokens(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["done"])
    llm = _model(qwen_tokenizer, engine, chat=ChatConfig(max_observation_tokens=5))
    history = [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}]),
        ToolMessage("alpha beta gamma delta epsilon zeta eta theta", tool_call_id="c1"),
    ]
    await llm.ainvoke(history)
    prompt = qwen_tokenizer.decode(engine.prompts[0])
    assert "alpha beta gamma delta epsilon\n[truncated: 4 more tokens]" in prompt
    assert "zeta" not in prompt


async def test_special_token_stops_map_to_ids_and_other_stops_stay_text(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["x"])
    await _model(qwen_tokenizer, engine).ainvoke("hi", stop=["<|endoftext|>", "the end"])
    assert engine.requests[0][1].stop_token_ids == (151643,)
    assert engine.requests[0][1].stop == ("the end",)


async def test_without_engine_outside_rollout_says_what_to_do():
    with pytest.raises(NoEngineError, match="sdk.rollout"):
        await TokenChatModel().ainvoke("hi")


async def test_astream_yields_the_recorded_reply_once(qwen_tokenizer, scripted):
    reply = 'Sure.\n<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'
    engine = scripted(qwen_tokenizer, [reply, reply])
    llm = _model(qwen_tokenizer, engine).bind_tools([add])
    chunks = [chunk async for chunk in llm.astream([HumanMessage("2+3?")])]
    invoked = await llm.ainvoke([HumanMessage("2+3?")])

    (chunk,) = chunks  # the engine answers whole responses: one chunk, after the one call
    assert chunk.content == invoked.content == "Sure."
    assert [(c["name"], c["args"]) for c in chunk.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert chunk.response_metadata["finish_reason"] == "stop"
    assert chunk.usage_metadata == invoked.usage_metadata
    assert engine.prompts[0] == engine.prompts[1]  # same prompt ids as ainvoke sends
    assert [c.content for c in _model(qwen_tokenizer, scripted(qwen_tokenizer, ["hi"])).stream(
        "x")] == ["hi"]


async def test_a_streamed_graph_records_the_same_trajectory_as_an_invoked_one(qwen_tokenizer,
                                                                              scripted):
    import agentrl_sdk as sdk
    from langgraph.graph import START, MessagesState, StateGraph

    @sdk.trainable("talker")
    async def talker(state, config):
        llm = sdk.chat_model(config)
        text = "".join([str(c.content) async for c in llm.astream(state["messages"])])
        return {"messages": [AIMessage(text)]}

    builder = StateGraph(MessagesState)
    builder.add_node("talker", talker)
    builder.add_edge(START, "talker")
    graph = builder.compile()
    row = {"id": "r", "messages": [{"role": "user", "content": "hi"}]}
    engine = scripted(qwen_tokenizer, ["hello there"])
    (traj,) = await sdk.arollout(graph, row, engine, tokenizer=qwen_tokenizer)

    assert traj.status == "ok" and traj.final_state["messages"][-1].content == "hello there"
    (call,) = traj.calls
    assert call.node == "talker" and call.trained
    expected = qwen_tokenizer.encode("hello there", add_special_tokens=False) + [engine.im_end]
    assert call.response_ids == expected == traj.segments[0].response_ids
    assert traj.segments[0].response_mask == [1] * len(expected)


async def test_json_mode_structured_output(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ['{"city":"Oslo","celsius":-3}', '{"a": 1}', "not json"])
    weather = _model(qwen_tokenizer, engine).with_structured_output(Weather, method="json_schema")
    assert await weather.ainvoke("Oslo?") == Weather(city="Oslo", celsius=-3)
    prompt = qwen_tokenizer.decode(engine.prompts[0])
    assert "matching this JSON schema" in prompt and '"celsius"' in prompt

    plain = _model(qwen_tokenizer, engine).with_structured_output(method="json_mode")
    assert await plain.ainvoke([SystemMessage("Be terse."), HumanMessage("a?")]) == {"a": 1}
    assert "Be terse.\n\nAnswer with a single JSON object" in qwen_tokenizer.decode(
        engine.prompts[1])

    raw = _model(qwen_tokenizer, engine).with_structured_output(
        Weather, method="json_mode", include_raw=True)
    out = await raw.ainvoke("x")
    assert out["parsed"] is None and out["raw"].content == "not json"
    assert out["parsing_error"] is not None
    with pytest.raises(ValueError, match="unknown structured output method"):
        _model(qwen_tokenizer, engine).with_structured_output(Weather, method="xml")
