"""The torch engine's prefix cache: keys and values of token sequences it has already run, so a
later prompt that starts with them prefills only the rest.

Agent rollouts repeat themselves: the n samples of a group share their prompt (system prompt,
tool schema, question), and each call of a tool loop extends the context of the call before
it. Without a cache, every call prefills its whole context again; for a small model on a CPU
that is about half of a rollout's time.

Entries are found by hashes of whole blocks of tokens (each hash chained to the one before, as
vLLM does), checked against the stored tokens, kept least-recently-used within a byte budget,
and dropped when the weights that computed them change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["BLOCK_TOKENS", "PrefixCache", "PrefixHit"]

BLOCK_TOKENS = 16
"""Prefixes are matched in whole blocks of this many tokens."""


@dataclass(eq=False)
class _Entry:
    """Keys and values of ``tokens``: those of ``tokens[:start]`` are ``base``'s (a group's
    shared prompt, a tool loop's earlier call), only the rest are this entry's own."""

    adapter: str | None
    tokens: tuple[int, ...]
    base: _Entry | None
    start: int
    keys: list[torch.Tensor]  # per layer (H, len(tokens) - start, D)
    values: list[torch.Tensor]
    hashes: list[int]  # of its own blocks

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def parts(self, length: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """Per-layer keys and values of ``tokens[:length]``, in token order, as views."""
        parts = []
        entry: _Entry | None = self
        while entry is not None and length > 0:
            if length > entry.start:
                own = length - entry.start
                parts.append(([k[:, :own] for k in entry.keys], [v[:, :own] for v in entry.values]))
                length = entry.start
            entry = entry.base
        return parts[::-1]


@dataclass(frozen=True)
class PrefixHit:
    """The first ``length`` tokens of a context, cached: per-layer ``(H, n, D)`` keys and values
    of consecutive runs of them (``parts``), which `write` lays end to end."""

    length: int
    parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]]
    source: _Entry | None = None
    """The entry that holds ``parts[0]`` (the first tokens: a group's prompt, when the group's
    rows call again): hits with the same source and first part share those keys."""

    @property
    def first_width(self) -> int:
        """How many tokens ``parts[0]`` holds."""
        return self.parts[0][0][0].shape[1]

    def write(self, which: str, layer: int, out: torch.Tensor) -> None:
        """Copy layer ``layer``'s ``which`` ("keys" or "values") into the last ``length``
        columns of ``out`` ``(H, W, D)``."""
        at = out.shape[1] - self.length
        for keys, values in self.parts:
            part = (keys if which == "keys" else values)[layer]
            out[:, at : at + part.shape[1]] = part
            at += part.shape[1]


class PrefixCache:
    """Cached keys and values by token prefix, per adapter (None: the base weights).

    An entry stores only the tokens no earlier entry holds: the n rollouts of a group share
    their prompt's keys, and each call of a tool loop adds only what came after the call before
    it. An entry's bases are used more recently than it (a hit or insert touches the chain), so
    the least recently used entry is never another's base.

    Args:
        max_bytes: Budget of the stored tensors; the least recently used entries leave first.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[tuple[str | None, int], tuple[int, int]] = {}  # -> entry id, tokens
        self._bytes = 0
        self.hit_tokens = 0  # prompt tokens not prefilled thanks to the cache

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values."""
        return self._bytes

    def lookup(self, adapter: str | None, context: Sequence[int]) -> PrefixHit | None:
        """The longest cached whole-block prefix of ``context``, leaving at least its last
        token to prefill (its logits sample the next token); None without one. Counted in
        ``hit_tokens``."""
        found = self._longest(adapter, context, len(context) - 1)
        if found is None:
            return None
        entry, length = found
        self._touch(entry)
        self.hit_tokens += length
        source = entry
        while source.base is not None:
            source = source.base
        return PrefixHit(length, entry.parts(length), source)

    def cached_length(self, adapter: str | None, context: Sequence[int]) -> int:
        """How many leading tokens of ``context`` `lookup` would find (not counted)."""
        found = self._longest(adapter, context, len(context) - 1)
        return 0 if found is None else found[1]

    def _longest(
        self, adapter: str | None, context: Sequence[int], limit: int
    ) -> tuple[_Entry, int] | None:
        """The entry holding the longest cached prefix within ``context[:limit]``, and its
        length, checked against the entry's tokens."""
        found: tuple[int, int] | None = None
        for blocks, h in enumerate(_block_hashes(context, limit), start=1):
            at = self._index.get((adapter, h))
            if at is None:
                break
            found = (at[0], blocks * BLOCK_TOKENS)
        if found is None:
            return None
        entry, length = self._entries[found[0]], found[1]
        if tuple(context[:length]) != entry.tokens[:length]:
            return None  # a hash collision
        return entry, length

    def insert(
        self,
        adapter: str | None,
        tokens: Sequence[int],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        offset: int = 0,
    ) -> None:
        """Keep ``tokens``' keys and values (whole blocks only), copying only those of the
        tokens no entry holds yet. ``keys``/``values``: per layer ``(H, n, D)``, the tokens'
        from ``offset`` on (those before it must be held already: see `held`). A tensor that
        holds exactly the new tokens is kept as it is: pass copies, not views of a batch."""
        length = len(tokens) // BLOCK_TOKENS * BLOCK_TOKENS
        found = self._longest(adapter, tokens, length)
        base, start = found if found is not None else (None, 0)
        if start == length or start < offset:
            return
        own = slice(start - offset, length - offset)  # the tokens' own columns
        entry = _Entry(
            adapter,
            tuple(tokens[:length]),
            base,
            start,
            [_owned(k, own) for k in keys],
            [_owned(v, own) for v in values],
            list(_block_hashes(tokens, length))[start // BLOCK_TOKENS :],
        )
        if entry.nbytes > self.max_bytes:
            return
        entry_id = id(entry)
        self._entries[entry_id] = entry
        self._bytes += entry.nbytes
        for blocks, h in enumerate(entry.hashes, start=start // BLOCK_TOKENS + 1):
            self._index[(adapter, h)] = (entry_id, blocks * BLOCK_TOKENS)
        self._touch(entry)
        while self._bytes > self.max_bytes:
            self._evict(next(iter(self._entries)))

    def held(self, adapter: str | None, tokens: Sequence[int]) -> tuple[int, int]:
        """How many leading tokens of ``tokens`` entries hold, and how many `insert` would
        keep (its whole blocks): what an insert must still copy lies between."""
        length = len(tokens) // BLOCK_TOKENS * BLOCK_TOKENS
        found = self._longest(adapter, tokens, length)
        return (0 if found is None else found[1]), length

    def clear(self, adapter: str | None = None, *, everything: bool = False) -> None:
        """Drop the entries of ``adapter`` (its weights changed), or all of them."""
        for entry_id, entry in list(self._entries.items()):
            if everything or entry.adapter == adapter:
                self._evict(entry_id)

    def _touch(self, entry: _Entry | None) -> None:
        """Mark ``entry`` and then its bases most recently used."""
        while entry is not None:
            self._entries.move_to_end(id(entry))
            entry = entry.base

    def _evict(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self._bytes -= entry.nbytes
        for blocks, h in enumerate(entry.hashes, start=entry.start // BLOCK_TOKENS + 1):
            if self._index.get((entry.adapter, h)) == (entry_id, blocks * BLOCK_TOKENS):
                del self._index[(entry.adapter, h)]


def _owned(t: torch.Tensor, columns: slice) -> torch.Tensor:
    """``t``'s ``columns`` (dim 1), copied unless they are all of a tensor of its own."""
    part = t[:, columns]
    whole = part.is_contiguous() and (
        part.untyped_storage().nbytes() == part.numel() * part.element_size()
    )
    return part if whole else part.clone()


def _block_hashes(tokens: Sequence[int], limit: int):
    """Chained hashes of the whole blocks within ``tokens[:limit]``."""
    h = 0
    for start in range(0, limit - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        h = hash((h, tuple(tokens[start : start + BLOCK_TOKENS])))
        yield h


def common_prefix(contexts: Sequence[Sequence[int]]) -> int:
    """How many leading whole blocks of tokens every context shares (in tokens), leaving each
    at least one token of its own."""
    limit = min(len(c) for c in contexts) - 1
    first = contexts[0]
    shared = 0
    while shared + BLOCK_TOKENS <= limit:
        block = first[shared : shared + BLOCK_TOKENS]
        if any(c[shared : shared + BLOCK_TOKENS] != block for c in contexts[1:]):
            break
        shared += BLOCK_TOKENS
    return shared


def inputs_after_prefixes(
    contexts: Sequence[Sequence[int]], hits: Sequence[PrefixHit | None], cache: object
) -> dict[str, object]:
    """Model inputs that prefill each context after its cached prefix.

    Layout per row: the cached prefix left-padded to the longest one (``C`` columns), then the
    rest of its context left-padded to the longest rest (``S`` columns). Padding is masked out
    wherever it sits, so every row's last token is in the last column, as `RunningBatch`
    expects. ``cache`` is an empty ``DynamicCache`` that receives the prefixes.
    """
    B = len(contexts)
    lengths = [h.length if h is not None else 0 for h in hits]
    C = max(lengths)
    rests = [list(c[n:]) for c, n in zip(contexts, lengths, strict=True)]
    S = max(len(r) for r in rests)
    some = next(h for h in hits if h is not None)
    ids = torch.zeros(B, S, dtype=torch.long)
    mask = torch.zeros(B, C + S, dtype=torch.long)
    positions = torch.zeros(B, S, dtype=torch.long)
    for b, (n, rest) in enumerate(zip(lengths, rests, strict=True)):
        ids[b, S - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        mask[b, C - n : C] = 1
        mask[b, C + S - len(rest) :] = 1
        positions[b, S - len(rest) :] = torch.arange(n, n + len(rest))
    for layer in range(len(some.parts[0][0])):
        keys, values = (
            torch.stack([_left_padded(h, which, layer, C, some) for h in hits])
            for which in ("keys", "values")
        )  # (B, H, C, D)
        cache.update(keys, values, layer)  # type: ignore[attr-defined]
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
            "past_key_values": cache}  # fmt: skip


def _left_padded(
    hit: PrefixHit | None, which: str, layer: int, width: int, like: PrefixHit
) -> torch.Tensor:
    keys, values = like.parts[0]
    template = (keys if which == "keys" else values)[layer]  # (H, n, D)
    out = template.new_zeros(template.shape[0], width, template.shape[2])
    if hit is not None:
        hit.write(which, layer, out)
    return out
