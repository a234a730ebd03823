"""Convert LangChain messages and tools to the OpenAI-style dicts chat templates render."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.utils.function_calling import convert_to_openai_tool

_ROLES: dict[type, str] = {
    SystemMessage: "system",
    HumanMessage: "user",
    AIMessage: "assistant",
    ToolMessage: "tool",
}


def message_text(message: BaseMessage) -> str:
    """The text of a message; content blocks that are not text are dropped."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
    return "".join(parts)


def to_template_message(
    message: BaseMessage, clip: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """One message as the dict a chat template renders; ``clip`` is applied to tool-message
    content (observation truncation by tokens)."""
    if isinstance(message, ChatMessage):
        role = message.role
    else:
        role = next((r for cls, r in _ROLES.items() if isinstance(message, cls)), None)
        if role is None:
            raise TypeError(f"cannot template a {type(message).__name__}")
    out: dict[str, Any] = {"role": role, "content": message_text(message)}
    if isinstance(message, AIMessage) and message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
            for c in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
        if clip is not None:
            out["content"] = clip(out["content"])
    return out


def with_format_instruction(
    messages: list[dict[str, Any]], response_format: dict[str, Any]
) -> list[dict[str, Any]]:
    """``messages`` with a system instruction to answer in JSON (and the schema, if any).

    The instruction joins the first system message (or becomes one), so every call of a
    JSON-mode model renders the same prefix and follow-up calls still extend the ledger.
    """
    instruction = "Answer with a single JSON object and nothing else."
    if response_format.get("schema"):
        schema = json.dumps(response_format["schema"], separators=(",", ":"))
        instruction = f"Answer with a single JSON object matching this JSON schema: {schema}"
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def to_openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools, pydantic models, functions or dicts as OpenAI tool schemas."""
    return [convert_to_openai_tool(t) for t in tools]


def checked_tool_choice(
    tool_choice: Any, tools: Sequence[dict[str, Any]] | None
) -> str | None:
    """``tool_choice`` in one form: None, ``auto``, ``none``, ``required`` or a bound tool's name.

    Accepts what LangChain's ``bind_tools`` and OpenAI's API accept: ``any`` and ``True`` mean
    ``required``; a name or ``{"type": "function", "function": {"name": ...}}`` names a tool.

    Raises:
        ValueError: ``tool_choice`` is none of these, or names a tool not in ``tools``.
    """
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return tool_choice
    if tool_choice == "any" or tool_choice is True:
        return "required"
    name = tool_choice
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
    known = [t["function"]["name"] for t in tools or []]
    if not isinstance(name, str) or name not in known:
        raise ValueError(
            f"tool_choice {tool_choice!r} is not 'auto', 'none', 'required'/'any' or the name "
            f"of a bound tool; bound tools: {known}"
        )
    return name


_TOOLS_KEYS: dict[int, tuple[list[dict[str, Any]], str]] = {}


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """A canonical string for a tool list, to notice when the bound tools change.

    A bound model passes the same list object on every call, so the key is memoised by
    identity (the list is kept alive beside its key, so its id cannot be reused).
    """
    if not tools:
        return "[]"
    hit = _TOOLS_KEYS.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    key = json.dumps(tools, sort_keys=True)
    if len(_TOOLS_KEYS) > 1024:
        _TOOLS_KEYS.clear()
    _TOOLS_KEYS[id(tools)] = (tools, key)
    return key
