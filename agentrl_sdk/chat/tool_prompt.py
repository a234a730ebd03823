"""Tool prompts for templates without tool support: Hermes-style messages, rendered around them.

A chat template that ignores ``tools`` (SmolLM2's ChatML, many base models) would silently drop
the tools from the prompt and render an assistant tool-call turn empty. The ``hermes`` tool
prompt rewrites the messages instead, so the model's own template renders them unchanged:

- the tools section of Qwen2.5's template (``# Tools ... <tools>...</tools> ...``) joins the
  first system message, or becomes one;
- an assistant message's ``tool_calls`` become ``<tool_call>\\n{json}\\n</tool_call>`` blocks
  after its content;
- consecutive tool results become one user turn of ``<tool_response>`` blocks.

Around a ChatML template this is, character for character, what the Hermes template of
`agentrl_sdk.models.templates` renders natively. Every message renders the same whatever
follows it, so a prefix-preserving template stays prefix-preserving (the token ledger relies
on it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from agentrl_sdk.config import ToolPromptMode

__all__ = ["hermes_messages", "hermes_tools_section", "renders_tools", "resolve_tool_prompt"]

Message = dict[str, Any]
Render = Callable[[list[Message], list[dict[str, Any]] | None], str]

_log = logging.getLogger(__name__)
_warned: set[str] = set()

_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "agentrl_probe",
        "description": "Probe whether the chat template renders tools.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def hermes_tools_section(tools: list[dict[str, Any]]) -> str:
    """The tools section Qwen2.5's template writes into the system turn (one JSON line a tool)."""
    lines = "".join("\n" + _tojson(tool) for tool in tools)
    return _TOOLS_HEAD + lines + _TOOLS_TAIL


def hermes_messages(
    messages: list[Message], tools: list[dict[str, Any]] | None
) -> list[Message]:
    """``messages`` rewritten so a template without tool support renders tools and calls: new
    dicts with roles system, user and assistant only (plus any other role the caller used), no
    ``tool_calls``. No ``tools`` adds no tools section (calls and results are still written).
    """
    out: list[Message] = []
    for k, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            out.append({"role": "assistant", "content": _with_calls(message)})
        elif role == "tool":
            block = f"<tool_response>\n{_text(message)}\n</tool_response>"
            if k and messages[k - 1].get("role") == "tool":
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{block}"}
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append(message)
    if not tools:
        return out
    section = hermes_tools_section(tools)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{_text(out[0])}\n\n{section}"}, *out[1:]]
    return [{"role": "system", "content": section}, *out]


def resolve_tool_prompt(
    mode: ToolPromptMode, renders: bool, name: str = "the chat template"
) -> Literal["native", "hermes"]:
    """The tool prompt to use with a template (``mode``: ``rollout.chat.tool_prompt``):
    ``auto`` picks native when it ``renders`` tools (`renders_tools`), else hermes with a
    warning naming it ``name``, once per name. ``native`` is returned as asked even when the
    template ignores tools: `ChatTemplate` refuses the first render that would lose them.
    """
    if mode != "auto":
        return mode
    if renders:
        return "native"
    if name not in _warned:
        _warned.add(name)
        _log.warning(
            "%s ignores tools: a Hermes-style tools section is written around it "
            "(rollout.chat.tool_prompt: hermes; set it explicitly to silence this warning)", name
        )
    return "hermes"


def renders_tools(render: Render) -> bool:
    """Whether the template's prompt changes when a tool is given (a probe render)."""
    probe = [{"role": "user", "content": "Hi."}]
    return render(probe, [_PROBE_TOOL]) != render(probe, None)


def _with_calls(message: Message) -> str:
    blocks = [f"<tool_call>\n{_call_json(call)}\n</tool_call>" for call in message["tool_calls"]]
    content = _text(message)
    return "\n".join([content, *blocks] if content else blocks)


def _call_json(call: dict[str, Any]) -> str:
    # Written as Qwen2.5's template writes it: the name verbatim, arguments as given or tojson.
    function = call.get("function", call)
    args = function.get("arguments")
    args_text = args if isinstance(args, str) else _tojson(args)
    return f'{{"name": "{function["name"]}", "arguments": {args_text}}}'


def _tojson(value: Any) -> str:
    # transformers' `tojson` filter: non-ASCII kept, default separators.
    return json.dumps(value, ensure_ascii=False)


def _text(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""
