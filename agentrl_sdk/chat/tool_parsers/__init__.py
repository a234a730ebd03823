"""Tool-call parsers: read calls out of generated text (pluggable by name)."""

from agentrl_sdk.chat.tool_parsers.base import (
    InvalidToolCall,
    ParsedResponse,
    ParsedToolCall,
    ToolParser,
)
from agentrl_sdk.chat.tool_parsers.hermes import HermesToolParser

TOOL_PARSERS: dict[str, type] = {"hermes": HermesToolParser}
"""Parsers by the name configs use."""

__all__ = [
    "TOOL_PARSERS",
    "HermesToolParser",
    "InvalidToolCall",
    "ParsedResponse",
    "ParsedToolCall",
    "ToolParser",
]
