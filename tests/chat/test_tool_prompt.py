"""Tool prompts: the Hermes section written around a template without tool support, auto and
native choice, and the token ledger and warm start through it (scripted engine, exact ids)."""

from __future__ import annotations

import logging
from itertools import groupby

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.chat import tool_prompt
from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.tool_prompt import hermes_messages, hermes_tools_section
from agentrl_sdk.config import ChatConfig
from agentrl_sdk.models.templates import CHATML_TEMPLATE
from agentrl_sdk.models.tokenizers import build_small_tokenizer
from agentrl_sdk.models.warm_start import build_sft_example
from examples.calculator.agent import build_graph, calculator, make_rows

TOOLS = to_openai_tools([calculator])


def tool_call(name: str, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is (3+4)*2 and 5*5?"},
    {"role": "assistant", "content": "",
     "tool_calls": [tool_call("calculator", {"expression": "3+4"})]},
    {"role": "tool", "content": "7"},
    {"role": "assistant", "content": "Two at once.",
     "tool_calls": [tool_call("calculator", {"expression": "7*2"}),
                    tool_call("calculator", '{"expression":"5*5"}')]},
    {"role": "tool", "content": "14"},
    {"role": "tool", "content": "25"},
    {"role": "assistant", "content": "14 and 25."},
]


@pytest.fixture(scope="module")
def hermes_tok():
    return build_small_tokenizer("hermes")


@pytest.fixture(scope="module")
def chatml_tok():
    """Same vocabulary as ``hermes_tok``; a ChatML template that ignores tools (as SmolLM2's)."""
    tok = build_small_tokenizer("hermes")
    tok.chat_template = CHATML_TEMPLATE
    return tok


@pytest.mark.parametrize("end", range(2, len(CONVERSATION) + 1))
def test_hermes_around_chatml_renders_what_the_hermes_template_renders(end, hermes_tok,
                                                                       chatml_tok):
    messages = CONVERSATION[:end]
    adapted, native = ChatTemplate(chatml_tok, "hermes"), ChatTemplate(hermes_tok)
    assert native.tool_prompt == "native"
    for gen in (True, False):
        assert adapted.render(messages, TOOLS, add_generation_prompt=gen) == native.render(
            messages, TOOLS, add_generation_prompt=gen)


def test_hermes_messages_exact():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert hermes_messages(CONVERSATION[1:7], tools) == [
        {"role": "system", "content": hermes_tools_section(tools)},
        CONVERSATION[1],
        {"role": "assistant",
         "content": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n'
                    "</tool_call>"},
        {"role": "user", "content": "<tool_response>\n7\n</tool_response>"},
        {"role": "assistant",
         "content": 'Two at once.\n<tool_call>\n{"name": "calculator", "arguments": '
                    '{"expression": "7*2"}}\n</tool_call>\n<tool_call>\n{"name": "calculator", '
                    '"arguments": {"expression":"5*5"}}\n</tool_call>'},
        {"role": "user",
         "content": "<tool_response>\n14\n</tool_response>\n<tool_response>\n25\n</tool_response>"},
    ]
    assert hermes_tools_section(tools) == (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "f", "parameters": {}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    )
    # Without tools no system turn is added; calls and results are still written.
    assert hermes_messages(CONVERSATION[1:4], None)[0] == CONVERSATION[1]


def test_auto_picks_native_when_the_template_renders_tools_else_hermes_warning_once(
    hermes_tok, chatml_tok, caplog, monkeypatch
):
    monkeypatch.setattr(tool_prompt, "_warned", set())
    assert ChatTemplate(hermes_tok).tool_prompt == "native"
    with caplog.at_level(logging.WARNING, logger="agentrl_sdk.chat.tool_prompt"):
        assert ChatTemplate(chatml_tok).tool_prompt == "hermes"
        assert ChatTemplate(chatml_tok, "auto").tool_prompt == "hermes"
    assert [r.getMessage() for r in caplog.records] == [
        "the chat template of the tokenizer ignores tools: a Hermes-style tools section is "
        "written around it (rollout.chat.tool_prompt: hermes; set it explicitly to silence "
        "this warning)"
    ]
    # Asked for explicitly, hermes is quiet.
    caplog.clear()
    monkeypatch.setattr(tool_prompt, "_warned", set())
    assert ChatTemplate(chatml_tok, "hermes").tool_prompt == "hermes"
    assert not caplog.records


def test_native_refuses_a_template_that_ignores_tools(chatml_tok):
    template = ChatTemplate(chatml_tok, "native")
    messages = CONVERSATION[:2]
    with pytest.raises(ValueError, match="ignores tools.*chat.tool_prompt: hermes"):
        template.render(messages, TOOLS, add_generation_prompt=True)
    # Without tools there is nothing to lose.
    assert template.render(messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is (3+4)*2 and 5*5?"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("mode", ["hermes", "auto"])
def test_warm_start_examples_through_the_adapter_equal_the_hermes_template_ones(
    mode, hermes_tok, chatml_tok
):
    adapted = build_sft_example(chatml_tok, CONVERSATION, TOOLS, tool_prompt=mode)
    assert adapted == build_sft_example(hermes_tok, CONVERSATION, TOOLS)
    with pytest.raises(ValueError, match="chat.tool_prompt: hermes"):
        build_sft_example(chatml_tok, CONVERSATION, TOOLS, tool_prompt="native")


CALL = '<tool_call>\n{"name":"calculator","arguments":{"expression":"%s"}}\n</tool_call>'


async def test_two_tool_turns_through_the_adapter_are_token_exact(chatml_tok, scripted):
    row = make_rows(1, seed=5)[0]
    a, b, c = row["operands"]
    engine = scripted(chatml_tok, [CALL % f"{a}+{b}", CALL % f"{a + b}*{c}", "Done."])
    config = sdk.RolloutConfig(chat=ChatConfig(tool_prompt="hermes"))
    (traj,) = await sdk.arollout(build_graph(), row, engine, tokenizer=chatml_tok, config=config)

    assert traj.status == "ok", traj.error
    calls = [tc["args"] for m in traj.final_state["messages"] for tc in getattr(m, "tool_calls", [])]
    assert calls == [{"expression": f"{a}+{b}"}, {"expression": f"{a + b}*{c}"}]
    (seg,) = traj.segments
    template = ChatTemplate(chatml_tok, "hermes")
    first_prompt = template.encode(template.render(row["messages"], TOOLS,
                                                   add_generation_prompt=True))
    assert seg.prompt_ids == engine.prompts[0] == first_prompt
    assert "<tools>\n" + '{"type": "function", "function": {"name": "calculator"' in \
        chatml_tok.decode(seg.prompt_ids)
    # Each later prompt extends the last one with exactly the ids generated and observed.
    for k in (1, 2):
        assert engine.prompts[k][: len(engine.prompts[k - 1])] == engine.prompts[k - 1]
    assert engine.prompts[2] == seg.prompt_ids + seg.response_ids[: len(engine.prompts[2])
                                                                   - len(seg.prompt_ids)]
    pairs = zip(seg.response_ids, seg.response_mask, strict=True)
    observed = [[t for t, _ in run] for mask, run in groupby(pairs, key=lambda p: p[1]) if not mask]
    assert [chatml_tok.decode(ids) for ids in observed] == [
        f"\n<|im_start|>user\n<tool_response>\n{v}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" for v in (a + b, (a + b) * c)
    ]
    assert seg.generated_ids == [t for call in traj.calls for t in call.response_ids]


async def test_native_tool_prompt_fails_the_rollout_with_the_fix(chatml_tok, scripted):
    row = make_rows(1, seed=5)[0]
    engine = scripted(chatml_tok, ["unused"])
    config = sdk.RolloutConfig(chat=ChatConfig(tool_prompt="native"))
    (traj,) = await sdk.arollout(build_graph(), row, engine, tokenizer=chatml_tok, config=config)
    assert traj.status == "graph_error"
    assert "chat.tool_prompt: hermes" in traj.error
    assert engine.prompts == []
