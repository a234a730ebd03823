"""Reading one JSON tool call (``{"name": ..., <args key>: {...}}``): shared by every parser."""

from __future__ import annotations

import json
import re

from agentrl_sdk.chat.tool_parsers.base import InvalidToolCall, ParsedResponse, ParsedToolCall

_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


def read_call(
    raw: str, args_keys: tuple[str, ...] = ("arguments",)
) -> ParsedToolCall | InvalidToolCall:
    """The call written as JSON text ``raw``; invalid when it is not JSON or not call-shaped."""
    try:
        call = json.loads(raw)
    except json.JSONDecodeError as exc:
        return invalid(raw, f"tool call is not valid JSON: {exc.msg}")
    return call_from_object(call, raw, args_keys)


def call_from_object(
    call: object, raw: str, args_keys: tuple[str, ...] = ("arguments",)
) -> ParsedToolCall | InvalidToolCall:
    """The call a decoded JSON value describes; its arguments under the first of ``args_keys``
    present (missing or null: no arguments)."""
    if not isinstance(call, dict):
        return invalid(raw, "tool call must be a JSON object")
    if not isinstance(call.get("name"), str) or not call["name"]:
        return invalid(raw, 'tool call needs a string "name"')
    key = next((k for k in args_keys if k in call), args_keys[0])
    args = call.get(key)
    if args is not None and not isinstance(args, dict):
        return invalid(raw, f'"{key}" must be a JSON object')
    return ParsedToolCall(name=call["name"], args=args or {})


def invalid(raw: str, error: str) -> InvalidToolCall:
    """An invalid call, named when a ``"name"`` can still be read from ``raw``."""
    name = _NAME.search(raw)
    return InvalidToolCall(name=name.group(1) if name else None, args=raw, error=error)


def response(content: str, found: list[ParsedToolCall | InvalidToolCall]) -> ParsedResponse:
    """A parsed response from its content and the calls found, in order."""
    return ParsedResponse(
        content=content,
        tool_calls=[c for c in found if isinstance(c, ParsedToolCall)],
        invalid_tool_calls=[c for c in found if isinstance(c, InvalidToolCall)],
    )
