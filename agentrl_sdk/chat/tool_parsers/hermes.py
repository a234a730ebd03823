"""Hermes / Qwen tool-call format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import re

from agentrl_sdk.chat.tool_parsers._json_call import invalid, read_call, response
from agentrl_sdk.chat.tool_parsers.base import ParsedResponse, ReadCall, json_call_prefix

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


class HermesToolParser:
    """Parses Hermes-style tool calls; a block that is not valid JSON becomes an invalid call.

    An unterminated ``<tool_call>`` (generation cut by the token budget) is an invalid call too.
    """

    def call_prefix(self, name: str | None) -> str:
        """See `ToolParser.call_prefix`."""
        return "<tool_call>\n" + json_call_prefix(name, "arguments")

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content (the text outside call blocks) and calls."""
        found: list[ReadCall] = []
        for match in _CALL.finditer(text):
            raw = match.group(1).strip()
            if match.group(0).endswith("</tool_call>"):
                found.append(read_call(raw))
            else:
                found.append(invalid(raw, "unterminated <tool_call> block"))
        return response(_CALL.sub("", text).strip(), found)
