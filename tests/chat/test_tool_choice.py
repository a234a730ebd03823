"""tool_choice is checked, recorded in the reply's metadata, and ``none`` drops the tools."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from agentrl_sdk import TokenChatModel


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
