"""Token ledger arithmetic on the real Qwen tokenizer and templates (exact ids, masks, reasons)."""

from __future__ import annotations

from agentrl_sdk.chat import ChatTemplate, NodeTag, TokenLedger
from agentrl_sdk.types import GenerateResult

COMPACT_CALL = '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You add numbers."}
USER = {"role": "user", "content": "What is 2+3?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
NODE = NodeTag("solver")


def _result(template: ChatTemplate, text: str, *, stop: bool = True, version: int = 0):
    ids = template.encode(text)
    if stop:
        ids += template.encode("<|im_end|>")
    return GenerateResult(
        token_ids=ids,
        logprobs=[-0.5] * len(ids),
        finish_reason="stop" if stop else "length",
        policy_version=version,
    )


def _reply_with_call() -> dict:
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _first_turn(ledger: TokenLedger, template: ChatTemplate):
    plan = ledger.plan([SYSTEM, USER], TOOLS, NODE)
    result = _result(template, COMPACT_CALL)
    ledger.commit(plan, result, _reply_with_call(), "r-0")
    return plan, result


def test_follow_up_extends_with_exact_generated_ids(qwen_tokenizer):
    template = ChatTemplate(qwen_tokenizer)
    ledger = TokenLedger(template)
    first, result = _first_turn(ledger, template)
    assert first.prompt_ids == template.encode(
        template.render([SYSTEM, USER], TOOLS, add_generation_prompt=True)
    )

    tool = {"role": "tool", "content": "5", "tool_call_id": "c1"}
    second = ledger.plan([SYSTEM, USER, _reply_with_call(), tool], TOOLS, NODE)

    assert second.segment_index == 0
    assert second.prompt_ids == first.prompt_ids + result.token_ids + second.observation_ids
    assert template.decode(second.observation_ids) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Re-templating the history would have trained on tokens the model never wrote.
    retemplated = template.encode(
        template.render([SYSTEM, USER, _reply_with_call(), tool], TOOLS, add_generation_prompt=True)
    )
    assert retemplated != second.prompt_ids
    assert '{"a": 2, "b": 3}' in template.decode(retemplated)
    assert '{"a":2,"b":3}' in template.decode(second.prompt_ids)

    final = _result(template, "The answer is 5.", version=1)
    ledger.commit(second, final, {"role": "assistant", "content": "The answer is 5."}, "r-1")
    (segment,) = ledger.segments
    assert segment.generated_ids == result.token_ids + final.token_ids
    assert segment.response_mask == (
        [1] * len(result.token_ids) + [0] * len(second.observation_ids) + [1] * len(final.token_ids)
    )
    assert segment.response_versions == (
        [0] * len(result.token_ids) + [-1] * len(second.observation_ids) + [1] * len(final.token_ids)
    )
    assert len(segment.response_logprobs) == len(segment.response_ids)
    assert [c.turn for c in ledger.calls] == [0, 1]
    assert segment.num_calls == 2


def test_length_cut_reply_is_closed_with_template_tokens(qwen_tokenizer):
    template = ChatTemplate(qwen_tokenizer)
    ledger = TokenLedger(template)
    plan = ledger.plan([SYSTEM, USER], None, NODE)
    ledger.commit(plan, _result(template, "I think", stop=False), {"role": "assistant", "content": "I think"}, "r")
    follow = ledger.plan(
        [SYSTEM, USER, {"role": "assistant", "content": "I think"}, {"role": "user", "content": "go on"}],
        None,
        NODE,
    )
    assert follow.segment_index == 0
    assert template.decode(follow.observation_ids).startswith("<|im_end|>\n<|im_start|>user\ngo on")


def test_think_stripping_template_starts_new_segment(qwen3_tokenizer):
    template = ChatTemplate(qwen3_tokenizer)
    ledger = TokenLedger(template)
    thought = "<think>\nadd them\n</think>\n\n" + COMPACT_CALL
    reply = {**_reply_with_call(), "content": "<think>\nadd them\n</think>"}
    plan = ledger.plan([USER], TOOLS, NODE)
    ledger.commit(plan, _result(template, thought), reply, "r-0")

    # A tool result keeps the current turn: the template still shows the thinking.
    tool = {"role": "tool", "content": "5", "tool_call_id": "c1"}
    extended = ledger.plan([USER, reply, tool], TOOLS, NODE)
    assert extended.segment_index == 0
    ledger.release(extended)

    # A new user turn makes Qwen3 drop the earlier thinking: history is rewritten.
    nxt = {"role": "user", "content": "And 4+4?"}
    fresh = ledger.plan([USER, reply, nxt], TOOLS, NODE)
    assert fresh.segment_index is None
    assert fresh.start_reason == "template_not_prefix_preserving"
    assert "add them" not in template.decode(fresh.prompt_ids)


def test_edited_history_and_other_node_start_new_segments(qwen_tokenizer):
    template = ChatTemplate(qwen_tokenizer)
    ledger = TokenLedger(template)
    _first_turn(ledger, template)
    tool = {"role": "tool", "content": "5", "tool_call_id": "c1"}

    edited_reply = {"role": "assistant", "content": "let me think"}
    edited = ledger.plan([SYSTEM, USER, edited_reply, tool], TOOLS, NODE)
    assert (edited.segment_index, edited.start_reason) == (None, "history_edited")

    other = ledger.plan([SYSTEM, USER, _reply_with_call(), tool], TOOLS, NodeTag("critic"))
    assert (other.segment_index, other.start_reason) == (None, "node_changed")

    new_tools = ledger.plan([SYSTEM, USER, _reply_with_call(), tool], [], NODE)
    assert new_tools.start_reason == "template_not_prefix_preserving"

    unrelated = ledger.plan([{"role": "user", "content": "hi"}], None, NODE)
    assert unrelated.start_reason == "new_conversation"


def test_concurrent_calls_never_extend_the_same_segment(qwen_tokenizer):
    template = ChatTemplate(qwen_tokenizer)
    ledger = TokenLedger(template)
    _first_turn(ledger, template)
    history = [SYSTEM, USER, _reply_with_call(), {"role": "tool", "content": "5", "tool_call_id": "c"}]
    a = ledger.plan(history, TOOLS, NODE)
    b = ledger.plan(history, TOOLS, NODE)
    assert a.segment_index == 0
    assert b.segment_index is None
    ledger.release(a)
    assert ledger.plan(history, TOOLS, NODE).segment_index == 0


def test_a_response_resumed_on_new_weights_keeps_each_tokens_version(qwen_tokenizer):
    template = ChatTemplate(qwen_tokenizer)
    ledger = TokenLedger(template)
    plan = ledger.plan([SYSTEM, USER], TOOLS, NODE)
    result = _result(template, COMPACT_CALL, version=4)
    n = len(result.token_ids)
    # Paused after 3 tokens, resumed after a weight update: 3 tokens of v3, the rest of v4.
    resumed = result.model_copy(update={"token_versions": [3] * 3 + [4] * (n - 3)})
    call = ledger.commit(plan, resumed, _reply_with_call(), "r-0")
    (segment,) = ledger.segments
    assert segment.response_versions == [3, 3, 3] + [4] * (n - 3)
    assert call.policy_version == 4


def test_a_dropped_reply_is_history_edited_whatever_follows(qwen_tokenizer):
    """The node's earlier prompt with its reply left out reads as edited history, whether one
    message or several take the reply's place (it used to depend on the count)."""
    template = ChatTemplate(qwen_tokenizer)
    nxt = {"role": "user", "content": "And 4+4?"}
    more = {"role": "user", "content": "Quickly."}
    for follow_up in ([SYSTEM, USER, nxt], [SYSTEM, USER, nxt, more]):
        ledger = TokenLedger(template)
        _first_turn(ledger, template)
        plan = ledger.plan(follow_up, TOOLS, NODE)
        assert (plan.segment_index, plan.start_reason) == (None, "history_edited")
    # The same prompt asked again (a second sample of one question) is not an edit.
    ledger = TokenLedger(template)
    _first_turn(ledger, template)
    assert ledger.plan([SYSTEM, USER], TOOLS, NODE).start_reason == "new_conversation"
