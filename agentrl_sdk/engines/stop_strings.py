"""`StopStrings`: end a request once the text it generated contains a stop string.

Engines see token ids only, yet LangChain and OpenAI clients stop on text (``stop=["\\n\\n"]``)
whatever tokens spell it. Every engine checks its requests' generated ids here after each new
token, so stops behave the same on every backend: the request ends with the token that
completed a stop string (kept, as sampled), and the chat layer cuts the reply's text there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["StopStrings"]


class StopStrings:
    """Finds when a request's decoded generated text first contains one of ``stops``.

    Checked after every token, so the first hit always ends in the newest token: only a
    window of the newest ids is decoded. A stop of ``c`` characters is at most ``4c`` UTF-8
    bytes, so at most ``4c`` byte-level tokens; one token more keeps a partial character (or
    a SentencePiece leading space) at the window's start from hiding it.

    Args:
        tokenizer: The served model's tokenizer; ids are decoded with their special tokens,
            as the chat layer decodes them.
        stops: The stop strings; none may be empty.

    Raises:
        ValueError: A stop string is empty.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        if not stops or any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty, got {list(stops)!r}")
        self.stops = tuple(stops)
        self._tokenizer = tokenizer
        self._window = 4 * max(len(s) for s in self.stops) + 1

    def hit(self, token_ids: list[int]) -> bool:
        """Whether the text of ``token_ids`` contains a stop string ending in its last token."""
        text = self._tokenizer.decode(token_ids[-self._window :], skip_special_tokens=False)
        return any(stop in text for stop in self.stops)

    def first_hit(self, token_ids: list[int], checked: int) -> int | None:
        """How many of ``token_ids`` to keep: the shortest prefix longer than ``checked`` whose
        text contains a stop string, or None when no new token completes one."""
        for n in range(checked + 1, len(token_ids) + 1):
            if self.hit(token_ids[:n]):
                return n
        return None

