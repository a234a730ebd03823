"""The `ToolParser` protocol: turn generated text into content, tool calls and invalid calls."""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, Field


class ParsedToolCall(BaseModel):
    """A well-formed call: a known JSON shape with a name and an arguments object."""

    name: str
    args: dict[str, Any]


class InvalidToolCall(BaseModel):
    """A call block the parser found but could not read; goes back to the model as an error."""

    name: str | None = None
    args: str = Field(description="The raw text of the call block.")
    error: str


ReadCall = ParsedToolCall | InvalidToolCall
"""A call block as read: well-formed, or invalid."""


class ParsedResponse(BaseModel):
    """Generated text split into what LangGraph needs for control flow."""

    content: str
    tool_calls: list[ParsedToolCall] = Field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = Field(default_factory=list)


def json_call_prefix(name: str | None, arguments_key: str) -> str:
    """``{"name": "<name>", "<arguments_key>": `` (or ``{"name": "`` without a name): how the
    JSON call formats open, exactly as a model writes them (``json.dumps`` spacing)."""
    if name is None:
        return '{"name": "'
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{arguments_key}": '


class ToolParser(Protocol):
    """Reads tool calls out of generated text. Used for control flow only: the trained tokens
    are always the generated ids, never a re-rendering of what the parser returns."""

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content and tool calls."""
        ...

    def call_prefix(self, name: str | None) -> str:
        """The text that opens a tool call in this format, up to the arguments of tool
        ``name``, or up to the opening quote of the name when ``name`` is None. Written into
        the reply ahead of sampling to force a call (``tool_choice``)."""
        ...
