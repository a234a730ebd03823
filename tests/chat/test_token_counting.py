"""TokenChatModel counts tokens with the model's own tokenizer and chat template."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages
from langchain_core.tools import tool

from agentrl_sdk import NoEngineError, TokenChatModel
from agentrl_sdk.chat import ChatTemplate, RolloutRecorder, current_recorder


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_token_ids_are_the_model_tokenizers(qwen_tokenizer):
    model = TokenChatModel(tokenizer=qwen_tokenizer)
    assert model.get_token_ids("hello world") == qwen_tokenizer.encode(
        "hello world", add_special_tokens=False)
    assert model.get_num_tokens("hello world") == 2


def test_messages_count_as_the_template_renders_them(qwen_tokenizer):
    model = TokenChatModel(tokenizer=qwen_tokenizer)
    messages = [SystemMessage("Be brief."), HumanMessage("hi"), AIMessage("hello")]
    dicts = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello"}]
    text = qwen_tokenizer.apply_chat_template(dicts, tokenize=False)
    assert model.get_num_tokens_from_messages(messages) == len(
        qwen_tokenizer.encode(text, add_special_tokens=False))
    assert model.get_num_tokens_from_messages(messages, tools=[add]) > (
        model.get_num_tokens_from_messages(messages))
    assert model.get_num_tokens_from_messages([]) == 0


def test_trim_messages_uses_the_model_as_token_counter(qwen_tokenizer):
    model = TokenChatModel(tokenizer=qwen_tokenizer)
    history = [SystemMessage("Be brief.")] + [
        m for i in range(6) for m in (HumanMessage(f"question {i}"), AIMessage(f"answer {i}"))
    ]
    # trim_messages counts the system message and the rest apart; Qwen's template gives the
    # rest its default system prompt, so the count is conservative, never short.
    count = model.get_num_tokens_from_messages
    budget = count(history[:1]) + count(history[-2:])
    assert count([history[0], *history[-2:]]) <= budget
    kept = trim_messages(history, max_tokens=budget, token_counter=model, strategy="last",
                         include_system=True, start_on="human")
    assert kept == [history[0], *history[-2:]]


def test_inside_a_rollout_the_recorders_template_counts(qwen_tokenizer, qwen3_tokenizer, scripted):
    model = TokenChatModel(tokenizer=qwen_tokenizer)
    template = ChatTemplate(qwen3_tokenizer)
    recorder = RolloutRecorder(scripted(qwen3_tokenizer, []), template)
    # Qwen3's template drops an earlier answer's reasoning; the Hermes one keeps it.
    messages = [HumanMessage("hi"), AIMessage("<think>a long line of thought</think>ok"),
                HumanMessage("more")]
    token = current_recorder.set(recorder)
    try:
        inside = model.get_num_tokens_from_messages(messages)
    finally:
        current_recorder.reset(token)
    dicts = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "<think>a long line of thought</think>ok"},
             {"role": "user", "content": "more"}]
    rendered = template.render(dicts, add_generation_prompt=False)
    assert "long line" not in rendered
    assert inside == len(template.encode(rendered))
    assert inside != model.get_num_tokens_from_messages(messages)


def test_without_tokenizer_outside_a_rollout_says_what_to_do():
    with pytest.raises(NoEngineError, match="tokenizer="):
        TokenChatModel().get_num_tokens("hi")
