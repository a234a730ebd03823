"""Tool-call parsers: read calls out of generated text (pluggable by name)."""

import importlib

from agentrl_sdk.chat.tool_parsers.base import (
    InvalidToolCall,
    ParsedResponse,
    ParsedToolCall,
    ToolParser,
)
from agentrl_sdk.chat.tool_parsers.hermes import HermesToolParser
from agentrl_sdk.chat.tool_parsers.llama3_json import Llama3JsonToolParser
from agentrl_sdk.chat.tool_parsers.mistral import MistralToolParser
from agentrl_sdk.config import TOOL_FORMATS


def _imported(parser: str) -> type[ToolParser]:
    """The class ``module:Class`` names."""
    module, _, name = parser.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    name: _imported(form.parser) for name, form in TOOL_FORMATS.items()
}
"""Parsers by the name configs use (``rollout.chat.tool_parser``), from
`agentrl_sdk.config.TOOL_FORMATS`."""

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
