"""Mistral tool calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""

from __future__ import annotations

import json

from agentrl_sdk.chat.tool_parsers._json_call import call_from_object, invalid, response
from agentrl_sdk.chat.tool_parsers.base import ParsedResponse, ReadCall, json_call_prefix

_TOOL_CALLS = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


class MistralToolParser:
    """Parses Mistral's ``[TOOL_CALLS]`` blocks: a JSON list of calls (a single call object is
    taken as a list of one). The content is the text outside the blocks.

    A block that is not valid JSON, an empty list, or an element that is not an object with a
    string ``"name"`` and an object ``"arguments"`` becomes an invalid call.
    """

    def call_prefix(self, name: str | None) -> str:
        """See `ToolParser.call_prefix`."""
        return _TOOL_CALLS + "[" + json_call_prefix(name, "arguments")

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content and calls."""
        content, *blocks = text.split(_TOOL_CALLS)
        found: list[ReadCall] = []
        for block in blocks:
            start = len(block) - len(block.lstrip())
            try:
                value, end = _DECODER.raw_decode(block, start)
            except json.JSONDecodeError as exc:
                error = f"tool calls after {_TOOL_CALLS} are not valid JSON: {exc.msg}"
                found.append(invalid(block.strip(), error))
                continue
            content += block[end:]
            items = value if isinstance(value, list) else [value]
            if not items:
                found.append(invalid(block[start:end], f"no tool call in the {_TOOL_CALLS} list"))
            for item in items:
                found.append(call_from_object(item, json.dumps(item, ensure_ascii=False)))
        return response(content.strip(), found)
