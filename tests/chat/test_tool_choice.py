"""tool_choice is checked, recorded in the reply's metadata, ``none`` drops the tools, and a
required or named choice forces the call's opening (mask 0)."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from agentrl_sdk import TokenChatModel
from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_choices_are_checked_when_bound(qwen_tokenizer):
    model = TokenChatModel(tokenizer=qwen_tokenizer)
    for bad in ("sometimes", "mul", {"type": "function", "function": {"name": "mul"}}):
        with pytest.raises(ValueError, match="tool_choice"):
            model.bind_tools([add], tool_choice=bad)


def test_choice_is_recorded_and_none_leaves_tools_out(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["a", "b", "c", "d"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer)
    choices = ["any", {"type": "function", "function": {"name": "add"}}, "none", None]
    replies = [model.bind_tools([add], tool_choice=c).invoke("2+3?") for c in choices]
    assert [r.response_metadata.get("tool_choice") for r in replies] == [
        "required", "add", "none", None]
    prompts = [qwen_tokenizer.decode(p) for p in engine.prompts]
    assert ["<tools>" in p for p in prompts] == [True, True, False, True]


def test_named_choice_must_be_bound_on_invoke_too(qwen_tokenizer, scripted):
    model = TokenChatModel(engine=scripted(qwen_tokenizer, ["a"]), tokenizer=qwen_tokenizer)
    with pytest.raises(ValueError, match="bound tools: \\[\\]"):
        model.invoke("hi", tool_choice="add")


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@pytest.mark.parametrize(("choice", "opening"), [
    ("add", '<tool_call>\n{"name": "add", "arguments": '),
    ("required", '<tool_call>\n{"name": "'),
])
async def test_required_and_named_choices_force_the_call_at_mask_0(
    qwen_tokenizer, scripted, choice, opening
):
    """The SDK writes the call's opening, the engine continues it; the opening is in the
    engine's prompt and in the segment at mask 0, the sampled ids at mask 1."""
    sampled = '{"a": 2, "b": 3}}\n</tool_call>' if choice == "add" else (
        'add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    engine = scripted(qwen_tokenizer, [sampled])
    template = ChatTemplate(qwen_tokenizer)
    recorder = RolloutRecorder(engine, template)
    token = current_recorder.set(recorder)
    try:
        reply = await TokenChatModel().bind_tools([add, mul], tool_choice=choice).ainvoke("2+3?")
    finally:
        current_recorder.reset(token)
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert reply.response_metadata["forced_opening"] == opening
    forced = template.encode(opening)
    (call,) = recorder.ledger.calls
    (segment,) = recorder.ledger.segments
    assert call.forced_ids == forced and engine.prompts[0][-len(forced):] == forced
    assert call.prompt_ids == engine.prompts[0]
    generated = call.response_ids
    assert segment.prompt_ids + segment.response_ids == engine.prompts[0] + generated
    assert segment.response_mask == [0] * len(forced) + [1] * len(generated)
    assert segment.generated_ids == generated  # only sampled ids are trained
    assert recorder.metrics["forced_tool_calls"] == 1


async def test_auto_and_none_force_nothing(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["4", "5"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer)
    for choice in ("auto", "none"):
        reply = await model.bind_tools([add], tool_choice=choice).ainvoke("2+3?")
        assert "forced_opening" not in reply.response_metadata
    assert all(qwen_tokenizer.decode(p).endswith("<|im_start|>assistant\n")
               for p in engine.prompts)
