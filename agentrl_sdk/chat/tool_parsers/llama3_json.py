"""Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}``, optionally after
``<|python_tag|>``, several separated by ``;``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from agentrl_sdk.chat.tool_parsers._json_call import call_from_object, invalid, response
from agentrl_sdk.chat.tool_parsers.base import ParsedResponse, ReadCall, json_call_prefix

_PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'\{\s*"name"\s*:')
# Llama 3.1 writes "parameters"; 3.2+ fine-tunes and vLLM's parser also accept "arguments".
_ARGS_KEYS = ("parameters", "arguments")
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser:
    """Parses Llama 3.x JSON tool calls.

    The calls are everything after ``<|python_tag|>`` (the text before it is content), or the
    whole text when it opens with a ``{"name": ...`` object. Any other text is content: a JSON
    answer without a ``"name"`` (JSON-mode output) stays an answer. Each call is an object with
    a string ``"name"`` and an object ``"parameters"`` (or ``"arguments"``). A call that is not
    valid JSON or not of that shape, text other than ``;`` between calls, or nothing after
    ``<|python_tag|>`` becomes an invalid call.
    """

    def call_prefix(self, name: str | None) -> str:
        """See `ToolParser.call_prefix`."""
        return json_call_prefix(name, "parameters")

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content and calls."""
        if _PYTHON_TAG in text:
            content, calls = text.split(_PYTHON_TAG, 1)
            if not calls.strip():
                return response(content.strip(), [invalid("", f"no tool call after {_PYTHON_TAG}")])
        elif _CALL_START.match(text.lstrip()):
            content, calls = "", text
        else:
            return ParsedResponse(content=text.strip())
        return response(content.strip(), list(_read_calls(calls)))


def _read_calls(text: str) -> Iterator[ReadCall]:
    pos = _skip_space(text, 0)
    while pos < len(text):
        try:
            call, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield invalid(text[pos:].strip(), f"tool call is not valid JSON: {exc.msg}")
            return
        yield call_from_object(call, text[pos:end], _ARGS_KEYS)
        pos = _skip_space(text, end)
        if pos < len(text) and text[pos] != ";":
            yield invalid(text[pos:].strip(), "expected ';' between tool calls, found other text")
            return
        pos = _skip_space(text, pos + 1)


def _skip_space(text: str, pos: int) -> int:
    return len(text) - len(text[pos:].lstrip())
