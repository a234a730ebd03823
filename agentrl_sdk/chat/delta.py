"""What a chat template adds for a follow-up call's new messages, rendered from a window.

Rendering the whole history twice per call (before and after the new messages) to find the
text they add costs the whole conversation on every call: quadratic in turns. Templates
render a message from the message itself, its neighbours, the conversation's head (system
turn, tools, first user query) and the parity of its position, so `DeltaRenderer` renders a
*window*: the head, the history's last one or two messages (an even number dropped between
them, so parities hold) and the new messages. It does not take that on trust:

- once per template, tool set and roles of the new messages, probe conversations (reasoning
  blocks, tool calls, user turns in the dropped middle) are rendered both ways and must agree;
- per conversation, the window is checked against a full render the first time it drops
  messages and again whenever the history has doubled since (linear in total);

a disagreement turns windows off for that template, tool set and roles (full renders from
then on; `DeltaRenderer.mismatches` counts it, and a warning says so once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl_sdk.chat.messages import tools_key

logger = logging.getLogger(__name__)

Message = dict[str, Any]
Render = Callable[[list[Message], list[Message] | None, bool], str]
"""``render(messages, tools, add_generation_prompt)``: the template's full text."""

_CALL = {"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}
_THINK = "<think>\nprobe reasoning\n</think>\n\n"


def _reply(content: str, *, call: bool) -> Message:
    return {"role": "assistant", "content": content, **({"tool_calls": [_CALL]} if call else {})}


def _agent_probe() -> list[Message]:
    """A tool loop whose reasoning and calls fall in the dropped middle, the last reply plain:
    a template that strips earlier reasoning at a new user turn rewrites only the middle."""
    out: list[Message] = [{"role": "user", "content": "Probe question?"}]
    for k in range(3):
        out += [_reply(_THINK, call=True), {"role": "tool", "content": f"r{k}", "tool_call_id": "p"}]
    return [*out, _reply("Probe answer.", call=False)]


def _chat_probe() -> list[Message]:
    """User turns after replies with reasoning: what a think-stripping template rewrites."""
    out: list[Message] = [{"role": "user", "content": "Probe question?"}]
    for k in range(3):
        out += [_reply(_THINK + f"a{k}", call=False), {"role": "user", "content": f"q{k}"}]
    return [*out, _reply("Probe answer.", call=False)]


_SYSTEM = {"role": "system", "content": "Probe system."}
_PROBES = [
    [_SYSTEM, *_agent_probe()],
    _agent_probe(),
    [_SYSTEM, *_chat_probe()],
    _chat_probe(),
]


@dataclass
class HistoryCheck:
    """A conversation's window checks: the history length at the last full-render check."""

    checked_at: int = 0


MIN_DROPPED = 6
"""Fewest messages a window drops. A shorter history renders in full: its window would save
less rendering than the full-render check of the conversation's first window costs."""


def window(old: list[Message]) -> list[Message] | None:
    """The messages of ``old`` a window keeps, or None when the history renders in full.

    The head is everything up to the first user message (system turn, first query); the tail
    the last one or two messages, so that an even number is dropped between: at least
    `MIN_DROPPED`, or no window.
    """
    first_user = next((i for i, m in enumerate(old) if m.get("role") == "user"), 0)
    head = first_user + 1
    tail = 1 if (len(old) - head - 1) % 2 == 0 else 2
    if len(old) - head - tail < MIN_DROPPED:
        return None
    return [*old[:head], *old[-tail:]]


class DeltaRenderer:
    """The text a template adds after ``old`` for the new messages of a follow-up call, from
    the template's full ``render``.

    Attributes:
        mismatches: Windows that disagreed with a full render (each turned windows off for
            its template, tool set and roles).
    """

    def __init__(self, render: Render) -> None:
        self._render = render
        self._windowable: dict[tuple[str, tuple[str, ...]], bool] = {}
        self.mismatches = 0

    def delta(
        self,
        old: list[Message],
        messages: list[Message],
        tools: list[Message] | None,
        check: HistoryCheck,
    ) -> str | None:
        """Text the template adds to ``old`` for ``messages[len(old):]`` (with the generation
        prompt), or None when adding them rewrites ``old``'s text (not prefix-preserving).

        ``messages`` must extend ``old``; ``check`` is the conversation's, updated in place.
        """
        new = messages[len(old) :]
        kept = window(old)
        if kept is None:
            return self.full_delta(old, messages, tools)
        key = (tools_key(tools), tuple(str(m.get("role")) for m in new))
        if not self._probed(key, new, tools):
            return self.full_delta(old, messages, tools)
        try:
            cheap = self.full_delta(kept, [*kept, *new], tools)
        except Exception:  # noqa: BLE001 - a window the template refuses: render in full
            cheap = None
        if cheap is None:  # whether the history is rewritten is decided in full
            return self.full_delta(old, messages, tools)
        if len(old) < 2 * check.checked_at:
            return cheap
        full = self.full_delta(old, messages, tools)
        check.checked_at = len(old)
        if full != cheap:
            self._disagree(key)
        return full

    def _probed(self, key: tuple[str, tuple[str, ...]], new: list[Message],
                tools: list[Message] | None) -> bool:
        """Whether windows agree with full renders on the probe conversations (cached)."""
        if (known := self._windowable.get(key)) is not None:
            return known
        agreed = 0
        for old in _PROBES:
            kept = window(old)
            assert kept is not None  # every probe is long enough to drop messages
            try:
                full = self.full_delta(old, [*old, *new], tools)
                cheap = self.full_delta(kept, [*kept, *new], tools)
            except Exception as exc:  # noqa: BLE001 - a shape the template refuses proves nothing
                logger.debug("window probe skipped: the template raised %r", exc)
                continue
            if full != cheap:
                self._windowable[key] = False
                return False
            agreed += 1
        self._windowable[key] = agreed > 0
        return agreed > 0

    def _disagree(self, key: tuple[str, tuple[str, ...]]) -> None:
        self._windowable[key] = False
        self.mismatches += 1
        if self.mismatches == 1:
            logger.warning(
                "the chat template renders new %s messages differently in a window of the "
                "history than in full; rendering these in full from now on (slower, exact)",
                "/".join(key[1]),
            )

    def full_delta(
        self, old: list[Message], messages: list[Message], tools: list[Message] | None
    ) -> str | None:
        """`delta` from two full renders (the exact, quadratic way; None: history rewritten)."""
        before = self._render(old, tools, False)
        after = self._render(messages, tools, True)
        if not after.startswith(before):
            return None
        return after[len(before) :]
