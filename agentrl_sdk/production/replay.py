"""Replaying traced prompts: each trace's input becomes a dataset row for `sdk.train`.

The row is rolled out afresh on the policy being trained, so any trace can be replayed, ours
or another tool's, whatever tokenizer served it. Messages in LangChain's serialized form
(``{"type": "human", ...}``) become chat rows (``{"role": "user", ...}``); the trace's id,
feedback and expectations travel in the row's ``extra_info`` for the reward function to read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl_sdk.production.records import TraceRecord

__all__ = ["RowFn", "chat_messages", "replay_row"]

RowFn = Callable[[TraceRecord], Mapping[str, Any] | None]
"""A user's row for a trace (e.g. its input plus a ground truth from its expectations), or
None to leave the trace out."""

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
          "user": "user", "assistant": "assistant"}
_MESSAGE_KEYS = ("content", "tool_calls", "tool_call_id", "name")


def replay_row(record: TraceRecord) -> dict[str, Any] | None:
    """The dataset row replaying ``record``'s input, or None when the input holds no chat.

    The row is the input's keys, with ``messages`` (or a verl ``prompt``) as chat messages,
    an ``id`` of ``trace-<trace id>`` unless the input has one, and ``extra_info.trace``: the
    trace's id, feedback and expectations.
    """
    inputs = record.inputs
    if not isinstance(inputs, Mapping):
        return None
    key = "messages" if "messages" in inputs else "prompt" if "prompt" in inputs else None
    if key is None:
        return None
    messages = chat_messages(inputs[key]) if isinstance(inputs[key], list) else None
    if not messages:
        return None
    row = {k: v for k, v in inputs.items() if k != key}
    row[key] = messages
    row.setdefault("id", f"trace-{record.trace_id}")
    extra = dict(row.get("extra_info") or {})
    extra["trace"] = {"trace_id": record.trace_id, "feedback": record.feedback,
                      "expectations": record.expectations}
    row["extra_info"] = extra
    return row


def replay_rows(
    records: Sequence[TraceRecord], row_fn: RowFn | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for ``records`` (by ``row_fn``, else `replay_row`) and the ids of the traces
    that gave none."""
    rows, left_out = [], []
    for record in records:
        row = row_fn(record) if row_fn is not None else replay_row(record)
        if row is None:
            left_out.append(record.trace_id)
        else:
            rows.append(dict(row))
    return rows, left_out


def chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]] | None:
    """``messages`` as chat rows hold them, or None if any is not a chat message."""
    chat = [_chat_message(m) for m in messages]
    return None if any(m is None for m in chat) else chat  # type: ignore[return-value]


def _chat_message(message: Any) -> dict[str, Any] | None:
    """A chat message as a row holds it (role, content, tool calls), or None if it is none."""
    if not isinstance(message, Mapping):
        return None
    role = _ROLES.get(str(message.get("role") or message.get("type") or ""))
    if role is None:
        return None
    out = {"role": role}
    out.update({k: message[k] for k in _MESSAGE_KEYS if message.get(k) is not None})
    out.setdefault("content", "")
    return out
