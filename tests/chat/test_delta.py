"""Windowed rendering of follow-up calls gives the very ids a full render of the history gives."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentrl_sdk.chat import ChatTemplate, NodeTag, TokenLedger
from agentrl_sdk.chat.delta import HistoryCheck, window
from agentrl_sdk.models.llama_tokenizer import build_llama3_tokenizer
from agentrl_sdk.models.templates import CHATML_TEMPLATE
from agentrl_sdk.types import GenerateResult

NODE = NodeTag("agent")
TOOLS = [{
    "type": "function",
    "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
}]  # fmt: skip
# Numbers every message: a window renders other numbers, so the probes must turn it off.
NUMBERED_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + ' #' + loop.index|string + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class FullRenderLedger(TokenLedger):
    """The ledger as it was: both sides of every follow-up rendered in full."""

    def _delta(self, conv, messages, tools, key):
        if key != conv.tools_key:
            return None
        return self.template.deltas.full_delta(conv.messages, messages, tools)


def _templates(qwen_tokenizer, qwen3_tokenizer) -> dict[str, ChatTemplate]:
    chatml = copy.deepcopy(qwen_tokenizer)
    chatml.chat_template = CHATML_TEMPLATE
    numbered = copy.deepcopy(qwen_tokenizer)
    numbered.chat_template = NUMBERED_TEMPLATE
    return {
        "hermes": ChatTemplate(qwen_tokenizer),
        "qwen3": ChatTemplate(qwen3_tokenizer),
        "chatml+hermes-tool-prompt": ChatTemplate(chatml, tool_prompt="hermes"),
        "llama3": ChatTemplate(build_llama3_tokenizer()),
        "numbered": ChatTemplate(numbered, tool_prompt="hermes"),
    }


def _result(template: ChatTemplate, text: str) -> GenerateResult:
    ids = template.encode(text) + template.encode(template.tokenizer.eos_token)
    return GenerateResult(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop",
                          policy_version=0)  # fmt: skip


def _conversation(think: bool, turns: int) -> list[tuple[list[dict[str, Any]], str, dict]]:
    """(new messages, reply text, reply message) per call: tool loops, several results at
    once, user follow-ups, with or without reasoning in the replies."""
    steps: list[tuple[list[dict[str, Any]], str, dict]] = []
    new: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    for k in range(turns):
        thought = f"<think>\nstep {k}\n</think>\n\n" if think else ""
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": k, "b": 3}}}
        if k % 5 == 4:  # a plain answer, then the user asks again
            text = f"{thought}It is {k + 3}."
            steps.append((new, text, {"role": "assistant", "content": text}))
            new = [{"role": "user", "content": f"And {k}+4?"}]
            continue
        text = thought + f'<tool_call>\n{{"name":"add","arguments":{{"a":{k},"b":3}}}}\n</tool_call>'
        reply = {"role": "assistant", "content": thought, "tool_calls": [call] * (1 + k % 2)}
        steps.append((new, text, reply))
        new = [{"role": "tool", "content": f"{k + 3}", "tool_call_id": f"c{k}"}] * (1 + k % 2)
    return steps


@pytest.mark.parametrize("think", [False, True])
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_windowed_prompts_equal_full_renders(qwen_tokenizer, qwen3_tokenizer, think, tools):
    for name, template in _templates(qwen_tokenizer, qwen3_tokenizer).items():
        windowed, full = TokenLedger(template), FullRenderLedger(template)
        messages: list[dict[str, Any]] = []
        for i, (new, text, reply) in enumerate(_conversation(think, turns=24)):
            messages = [*messages, *new]
            ours, theirs = windowed.plan(messages, tools, NODE), full.plan(messages, tools, NODE)
            where = f"{name}, call {i}"
            assert ours.prompt_ids == theirs.prompt_ids, where
            assert (ours.segment_index, ours.start_reason) == (
                theirs.segment_index, theirs.start_reason), where
            result = _result(template, text)
            windowed.commit(ours, result, reply, f"r{i}")
            full.commit(theirs, result, reply, f"r{i}")
            messages = [*messages, reply]
        assert [c.prompt_ids for c in windowed.calls] == [c.prompt_ids for c in full.calls]
        assert template.deltas.mismatches == 0, name
        windowed_roles = {roles for (_, roles), ok in template.deltas._windowable.items() if ok}
        expected = {
            "numbered": set(),  # every window disagrees on the probes: full renders
            "qwen3": {("tool",), ("tool", "tool")},  # a user turn may strip earlier thinking
        }.get(name, {("tool",), ("tool", "tool"), ("user",)})
        assert windowed_roles == expected, name


def test_user_turn_after_thinking_in_the_dropped_middle_starts_a_segment(qwen3_tokenizer):
    """Qwen3 strips reasoning before the last user query: a new user turn rewrites replies
    far back in the history, where no window looks; the ledger still sees it."""
    template = ChatTemplate(qwen3_tokenizer)
    ledger = TokenLedger(template)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    replies = ["<think>\nfirst\n</think>\n\nadd", "<think>\nagain\n</think>\n\nadd", "5."]
    for i, text in enumerate(replies):
        plan = ledger.plan(messages, None, NODE)
        reply = {"role": "assistant", "content": text}
        ledger.commit(plan, _result(template, text), reply, f"r{i}")
        messages = [*messages, reply]
        if i < 2:
            messages.append({"role": "tool", "content": "5", "tool_call_id": f"c{i}"})
    plan = ledger.plan([*messages, {"role": "user", "content": "And 4+4?"}], None, NODE)
    assert plan.start_reason == "template_not_prefix_preserving"


def test_probes_turn_windows_off_for_position_dependent_templates(qwen_tokenizer):
    numbered = copy.deepcopy(qwen_tokenizer)
    numbered.chat_template = NUMBERED_TEMPLATE
    template = ChatTemplate(numbered, tool_prompt="hermes")
    history = [{"role": "user", "content": "q"}]
    for k in range(6):
        history += [{"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": f"q{k}"}]
    old = history[:-1]
    assert window(old) is not None
    delta = template.deltas.delta(old, history, None, HistoryCheck())
    assert delta == f"<|im_start|>user #{len(history)}\nq5<|im_end|>\n<|im_start|>assistant\n"
    assert template.deltas._windowable == {("[]", ("user",)): False}


def test_window_keeps_head_and_parity():
    roles = ["system", "user", *["assistant", "tool"] * 4, "assistant"]
    old = [{"role": r, "content": str(i)} for i, r in enumerate(roles)]
    kept = window(old)
    assert [m["content"] for m in kept] == ["0", "1", "10"]  # 8 dropped: parity holds
    assert [m["content"] for m in window(old[:-1])] == ["0", "1", "8", "9"]
    assert window(old[:3]) is None  # nothing to drop
    assert window(old[:8]) is None  # 4 to drop: fewer than MIN_DROPPED, rendered in full
    assert len(window(old[:9])) == 3  # 6 dropped


def test_windows_check_against_full_renders_at_doublings(qwen_tokenizer, monkeypatch):
    template = ChatTemplate(copy.deepcopy(qwen_tokenizer))
    deltas = template.deltas
    fulls: list[int] = []
    real = deltas.full_delta

    def counting(old, messages, tools):
        if len(old) >= 4 and old[0] is history[0]:  # a full render of the real history
            fulls.append(len(old))
        return real(old, messages, tools)

    monkeypatch.setattr(deltas, "full_delta", counting)
    check = HistoryCheck()
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    for k in range(40):
        history += [{"role": "user", "content": f"q{k}"}]
        deltas.delta(history[:-1], history, None, check)
        history += [{"role": "assistant", "content": f"a{k}"}]
    # Short histories render in full; longer ones only at the first window (8 messages: 6
    # dropped) and whenever the history doubled since.
    assert fulls == [4, 6, 8, 16, 32, 64]
