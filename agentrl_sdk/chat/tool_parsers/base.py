"""The `ToolParser` protocol: turn generated text into content, tool calls and invalid calls."""

from __future__ import annotations

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


class ParsedResponse(BaseModel):
    """Generated text split into what LangGraph needs for control flow."""

    content: str
    tool_calls: list[ParsedToolCall] = Field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = Field(default_factory=list)


class ToolParser(Protocol):
    """Reads tool calls out of generated text. Used for control flow only: the trained tokens
    are always the generated ids, never a re-rendering of what the parser returns."""

    def parse(self, text: str) -> ParsedResponse:
        """Split ``text`` into content and tool calls."""
        ...
