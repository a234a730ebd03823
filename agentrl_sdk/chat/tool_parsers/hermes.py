"""Hermes / Qwen tool-call format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
import re

from agentrl_sdk.chat.tool_parsers.base import InvalidToolCall, ParsedResponse, ParsedToolCall

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


class HermesToolParser:
    """Parses Hermes-style tool calls; a block that is not valid JSON becomes an invalid call.

    An unterminated ``<tool_call>`` (generation cut by the token budget) is an invalid call too.
    """

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content (the text outside call blocks) and calls."""
        calls: list[ParsedToolCall] = []
        invalid: list[InvalidToolCall] = []
        for match in _CALL.finditer(text):
            raw = match.group(1).strip()
            if not match.group(0).endswith("</tool_call>"):
                invalid.append(_invalid(raw, "unterminated <tool_call> block"))
                continue
            try:
                call = json.loads(raw)
            except json.JSONDecodeError as exc:
                invalid.append(_invalid(raw, f"tool call is not valid JSON: {exc.msg}"))
                continue
            error = _shape_error(call)
            if error:
                invalid.append(_invalid(raw, error))
                continue
            calls.append(ParsedToolCall(name=call["name"], args=call.get("arguments") or {}))
        content = _CALL.sub("", text).strip()
        return ParsedResponse(content=content, tool_calls=calls, invalid_tool_calls=invalid)


def _shape_error(call: object) -> str | None:
    if not isinstance(call, dict):
        return "tool call must be a JSON object"
    if not isinstance(call.get("name"), str) or not call["name"]:
        return 'tool call needs a string "name"'
    args = call.get("arguments", {})
    if args is not None and not isinstance(args, dict):
        return '"arguments" must be a JSON object'
    return None


def _invalid(raw: str, error: str) -> InvalidToolCall:
    name = _NAME.search(raw)
    return InvalidToolCall(name=name.group(1) if name else None, args=raw, error=error)
