"""Tool-call parsers per model family: exact calls, content and errors from generated text."""

from __future__ import annotations

from typing import get_args

import pytest

from agentrl_sdk.chat.tool_parsers import (
    TOOL_PARSERS,
    HermesToolParser,
    InvalidToolCall,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedResponse,
    ParsedToolCall,
)
from agentrl_sdk.config import TOOL_FORMATS, ChatConfig


def call(name: str, **args) -> ParsedToolCall:
    return ParsedToolCall(name=name, args=args)


def test_the_config_choices_are_the_registry_names():
    names = get_args(ChatConfig.model_fields["tool_parser"].annotation)
    assert names == tuple(TOOL_FORMATS) == tuple(TOOL_PARSERS)
    assert TOOL_PARSERS == {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser,
                            "mistral": MistralToolParser}
    assert ChatConfig(tool_parser="mistral").tool_parser == "mistral"
    for name, form in TOOL_FORMATS.items():  # each name's summary reaches the reference
        assert f"{name} ({form.summary})" in ChatConfig.model_fields["tool_parser"].description


# --- hermes -----------------------------------------------------------------------------------

def test_hermes_calls_and_content():
    text = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
            '</tool_call>\n<tool_call>\n{"name":"mul","arguments":{"a":5,"b":4}}\n</tool_call>')
    assert HermesToolParser().parse(text) == ParsedResponse(
        content="Let me add.", tool_calls=[call("add", a=2, b=3), call("mul", a=5, b=4)]
    )


@pytest.mark.parametrize(("block", "name", "error"), [
    ('{"name": "add", "arguments": {"a": 2,}}', "add", "tool call is not valid JSON: Expecting "
     "property name enclosed in double quotes"),
    ('["add"]', None, "tool call must be a JSON object"),
    ('{"arguments": {}}', None, 'tool call needs a string "name"'),
    ('{"name": "add", "arguments": [2, 3]}', "add", '"arguments" must be a JSON object'),
])
def test_hermes_malformed_calls(block, name, error):
    parsed = HermesToolParser().parse(f"<tool_call>\n{block}\n</tool_call>")
    assert parsed == ParsedResponse(
        content="", invalid_tool_calls=[InvalidToolCall(name=name, args=block, error=error)]
    )


def test_hermes_unterminated_call_is_invalid():
    parsed = HermesToolParser().parse('<tool_call>\n{"name": "add", "argu')
    assert parsed.invalid_tool_calls == [InvalidToolCall(
        name="add", args='{"name": "add", "argu', error="unterminated <tool_call> block"
    )]


# --- llama3_json ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    '  {"name":"add","parameters":{"a":2,"b":3}}\n',
    '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}',
    '{"name": "add", "arguments": {"a": 2, "b": 3}}',  # the key Llama 3.2+ fine-tunes write
])
def test_llama3_single_call(text):
    assert Llama3JsonToolParser().parse(text) == ParsedResponse(
        content="", tool_calls=[call("add", a=2, b=3)]
    )


def test_llama3_calls_separated_by_semicolons_with_content_before_the_python_tag():
    text = ('I will compute both.<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; '
            '{"name": "mul", "parameters": {"a": 5, "b": 4}} ;{"name": "now"}')
    assert Llama3JsonToolParser().parse(text) == ParsedResponse(
        content="I will compute both.",
        tool_calls=[call("add", a=2, b=3), call("mul", a=5, b=4), call("now")],
    )


@pytest.mark.parametrize("text", [
    "The answer is 5.",
    '{"answer": 5}',  # JSON-mode output: no "name", not a call
    'Call {"name": "add"} maybe',  # a call only at the start or after <|python_tag|>
])
def test_llama3_plain_text_and_json_answers_are_content(text):
    assert Llama3JsonToolParser().parse(text) == ParsedResponse(content=text)


def test_llama3_malformed_calls():
    parser = Llama3JsonToolParser()
    assert parser.parse('{"name": "add", "parameters": {"a": 2') == ParsedResponse(
        content="", invalid_tool_calls=[InvalidToolCall(
            name="add", args='{"name": "add", "parameters": {"a": 2',
            error="tool call is not valid JSON: Expecting ',' delimiter",
        )],
    )
    assert parser.parse('{"name": "add", "parameters": "a=2"}; {"name": "mul"}') == ParsedResponse(
        content="", tool_calls=[call("mul")], invalid_tool_calls=[InvalidToolCall(
            name="add", args='{"name": "add", "parameters": "a=2"}',
            error='"parameters" must be a JSON object',
        )],
    )
    assert parser.parse('{"name": "add", "parameters": {}} then I stop') == ParsedResponse(
        content="", tool_calls=[call("add")], invalid_tool_calls=[InvalidToolCall(
            args="then I stop", error="expected ';' between tool calls, found other text",
        )],
    )
    assert parser.parse("Thinking.<|python_tag|>  ") == ParsedResponse(
        content="Thinking.", invalid_tool_calls=[InvalidToolCall(
            args="", error="no tool call after <|python_tag|>",
        )],
    )
    assert parser.parse('<|python_tag|>[1, 2]').invalid_tool_calls == [InvalidToolCall(
        args="[1, 2]", error="tool call must be a JSON object",
    )]


# --- mistral ----------------------------------------------------------------------------------

def test_mistral_calls_and_content():
    text = ('Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}, '
            '{"name": "mul", "arguments": {"a": 5, "b": 4}}]')
    assert MistralToolParser().parse(text) == ParsedResponse(
        content="Sure.", tool_calls=[call("add", a=2, b=3), call("mul", a=5, b=4)]
    )


def test_mistral_single_object_and_several_blocks():
    text = ('[TOOL_CALLS] {"name": "add", "arguments": {"a": 1, "b": 1}}\n'
            '[TOOL_CALLS][{"name": "now"}] done')
    assert MistralToolParser().parse(text) == ParsedResponse(
        content="done", tool_calls=[call("add", a=1, b=1), call("now")]
    )


def test_mistral_text_without_tool_calls_is_content():
    assert MistralToolParser().parse(" 5 ") == ParsedResponse(content="5")


def test_mistral_malformed_calls():
    parser = MistralToolParser()
    assert parser.parse('[TOOL_CALLS][{"name": "add", "arguments": {"a": 2}') == ParsedResponse(
        content="", invalid_tool_calls=[InvalidToolCall(
            name="add", args='[{"name": "add", "arguments": {"a": 2}',
            error="tool calls after [TOOL_CALLS] are not valid JSON: Expecting ',' delimiter",
        )],
    )
    text = '[TOOL_CALLS][{"name": "add", "arguments": [2, 3]}, {"arguments": {}}, {"name": "ok"}]'
    assert parser.parse(text) == ParsedResponse(
        content="",
        tool_calls=[call("ok")],
        invalid_tool_calls=[
            InvalidToolCall(name="add", args='{"name": "add", "arguments": [2, 3]}',
                            error='"arguments" must be a JSON object'),
            InvalidToolCall(args='{"arguments": {}}', error='tool call needs a string "name"'),
        ],
    )
    assert parser.parse("[TOOL_CALLS][]").invalid_tool_calls == [InvalidToolCall(
        args="[]", error="no tool call in the [TOOL_CALLS] list",
    )]
