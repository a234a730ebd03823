"""Tool-call parsers: read calls out of generated text (pluggable by name)."""

from agentrl_sdk.chat.tool_parsers.base import (
    InvalidToolCall,
    ParsedResponse,
    ParsedToolCall,
    ToolParser,
)
from agentrl_sdk.chat.tool_parsers.hermes import HermesToolParser
from agentrl_sdk.chat.tool_parsers.llama3_json import Llama3JsonToolParser
from agentrl_sdk.chat.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, type] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}
"""Parsers by the name configs use (``rollout.chat.tool_parser``)."""

__all__ = [
    "TOOL_PARSERS",
    "HermesToolParser",
    "InvalidToolCall",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedResponse",
    "ParsedToolCall",
    "ToolParser",
]
