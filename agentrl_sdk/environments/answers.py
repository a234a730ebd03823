"""How a reply becomes the answer a verifier scores: the last ``<answer>`` tag, the final
line, or the user's own function."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from langchain_core.messages import AIMessage

AnswerMode = Literal["tag", "last_line"]
AnswerExtractor = Callable[[str], "str | None"]

_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def last_answer_tag(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` in ``text``, or None.

    The same rule as reasoning-gym's own ``utils.extract_answer``."""
    matches = _TAG.findall(text)
    return matches[-1].strip() if matches else None


def last_line(text: str) -> str | None:
    """The last non-empty line of ``text``, stripped, or None for blank text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def answer_extractor(answer: AnswerMode | AnswerExtractor) -> AnswerExtractor:
    """The extraction function ``answer`` names (a callable is used as it is).

    Raises:
        ValueError: ``answer`` is neither ``"tag"``, ``"last_line"`` nor a callable.
    """
    if callable(answer):
        return answer
    if answer == "tag":
        return last_answer_tag
    if answer == "last_line":
        return last_line
    raise ValueError(f"answer must be 'tag', 'last_line' or a function text -> answer, "
                     f"got {answer!r}")


def final_reply(state: Any) -> str | None:
    """The text of the graph's last AI message (None when it ends on a tool call or no AI
    message)."""
    messages = state.get("messages", []) if isinstance(state, dict) else getattr(
        state, "messages", [])
    last = messages[-1] if messages else None
    if not isinstance(last, AIMessage) or last.tool_calls:
        return None
    return last.text if hasattr(last, "text") and isinstance(last.text, str) else str(
        last.content)
