"""Prompt text to token ids, cached by the pieces between added tokens.

A fast tokenizer first cuts its input at its added tokens (``<|im_start|>``, ``<tool_call>``)
and encodes each piece between them on its own, so the ids of a text are the ids of its
pieces end to end. Rendered prompts repeat most of their pieces: every rollout's first
prompt has the same system turn and tools section, every tool loop the same turn openings.
Caching pieces rather than whole texts encodes only what is new (a ~700-character prompt
costs ~0.3 ms to encode whole on one CPU core; its new question a few microseconds).

Pieces are encoded alone only where that is exactly what the tokenizer does inside a whole
text: the tokenizer is fast, its added tokens match the raw text as written (no stripping of
neighbouring spaces, no normalisation), and probe texts (words, spaces and newlines on both
sides of added tokens) encode the same both ways. A tokenizer that treats pieces by their
position (SentencePiece's space prepended to the first piece only) fails the probes and is
encoded whole.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)


class PieceEncoder:
    """``encode(text)``: the tokenizer's ids of ``text`` (``add_special_tokens=False``), from
    a cache of the pieces between its added tokens.

    Attributes:
        by_pieces: Whether texts are encoded piece by piece (False: whole, uncached by piece).
    """

    def __init__(self, tokenizer: Any, cache_size: int = 4096) -> None:
        self._tokenizer = tokenizer
        self._encode_piece = lru_cache(maxsize=cache_size)(self.encode_whole)
        self._added_ids = _plain_added_tokens(tokenizer)
        # Longest first: at a position the longest added token wins, as in the tokenizer.
        alternatives = sorted(self._added_ids, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
        self.by_pieces = bool(alternatives) and all(
            self._by_pieces(text) == self.encode_whole(text) for text in _probes(alternatives)
        )
        if alternatives and not self.by_pieces:
            logger.info("the tokenizer encodes the pieces between its added tokens differently "
                        "alone than in a whole text; prompts are encoded whole")  # fmt: skip

    def encode_whole(self, text: str) -> tuple[int, ...]:
        """The tokenizer's ids of ``text``, encoded in one call."""
        return tuple(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokenizer's ids of ``text``: by cached pieces where that is exact, else whole
        (and the whole text cached)."""
        return self._by_pieces(text) if self.by_pieces else self._encode_piece(text)

    def _by_pieces(self, text: str) -> tuple[int, ...]:
        parts = self._splitter.split(text)  # plain, added, plain, added, ..., plain
        if len(parts) == 1:
            return self._encode_piece(text)
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(self._added_ids[part])
            elif part:
                ids.extend(self._encode_piece(part))
        return tuple(ids)


def _probes(added: list[str]) -> list[str]:
    """Texts with words, spaces and newlines on both sides of added tokens."""
    first, last = added[0], added[-1]
    return [
        f"{first}hello world{last}",
        f"hello{first} world\n{last}\n\nThe end. {first}",
        f"{last}\n{first} x{last}y  z\t{first}",
    ]


def _plain_added_tokens(tokenizer: Any) -> dict[str, int]:
    """Content -> id of the tokenizer's added tokens when every one of them matches the raw
    text exactly as written; empty when pieces cannot be encoded alone."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer splits its own way
        return {}
    tokens = backend.get_added_tokens_decoder()
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in tokens.values()):
        return {}
    return {t.content: i for i, t in tokens.items() if t.content}
