"""The torch engine's running batch: per-request decode state over one left-padded KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentrl_sdk.engines.stop_strings import StopStrings
from agentrl_sdk.engines.torch.kv_cache import DECODE_ROOM, append_rows, fill_order, fits, keep_rows
from agentrl_sdk.engines.torch.prefix_cache import PrefixHit
from agentrl_sdk.engines.torch.sampling import SamplingBuffers, sample_next
from agentrl_sdk.engines.torch.shared_prompts import (
    PromptView, SharedPrompts, cat_left_padded, split_at_sources,
)
from agentrl_sdk.types import FinishReason, SamplingParams

__all__ = ["RunningBatch", "SequenceState"]


@dataclass(eq=False)
class SequenceState:
    """One request's decoding state: what it asked for and what it has generated so far."""

    prompt_ids: list[int]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator
    stop_strings: StopStrings | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    # Uniforms drawn ahead from ``generator`` for the next decode steps, one row per step.
    _uniforms: torch.Tensor | None = field(default=None, repr=False)
    _used: int = field(default=0, repr=False)

    def next_uniforms(self, vocab: int) -> torch.Tensor:
        """This request's ``(V,)`` uniforms for its next sampled token.

        Drawn from ``generator`` several steps at a time (one ``(k, V)`` draw is the same
        stream as ``k`` draws of ``V``), so the noise still depends on the seed and the step
        alone, at a fraction of the per-call cost. Never drawn past ``max_tokens``.
        """
        if self._uniforms is None or self._used == len(self._uniforms):
            left = self.sampling.max_tokens - len(self.token_ids)
            steps = max(1, min(_AHEAD_STEPS, left, _AHEAD_FLOATS // vocab))
            self._uniforms = torch.empty(steps, vocab)  # (k, V)
            self._uniforms.uniform_(_TINY, 1.0, generator=self.generator)
            self._used = 0
        self._used += 1
        return self._uniforms[self._used - 1]

    @property
    def context(self) -> list[int]:
        """What a prefill must feed: the prompt, then whatever was generated before a re-prefill."""
        return self.prompt_ids + self.token_ids

    def append(self, token: int, logprob: float, version: int = 0) -> FinishReason | None:
        """Record one token sampled by policy ``version``; return why generation ended, or None."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if token in self.stop_ids:
            return "stop"
        if self.stop_strings is not None and self.stop_strings.hit(self.token_ids):
            return "stop"
        if len(self.token_ids) >= self.sampling.max_tokens:
            return "length"
        return None


class RunningBatch:
    """Sequences decoded together, padded so every row's next token goes in the same column.

    Invariants: ``mask`` is ``(B, L)`` and covers exactly the ``L`` positions of ``cache``;
    every row's newest sampled token is in ``last`` and not yet in the cache; ``positions[b]``
    is that token's position id. Padding (on the left, or a gap where a row joined wider ones)
    holds finite values and is masked out. With ``shared``, a row's context starts with its
    group's prompt, stored there once, and ``cache`` holds only the rest.
    """

    def __init__(
        self,
        rows: list[Any],
        cache: DynamicCache | None,
        mask: torch.Tensor,
        positions: torch.Tensor,
        last: torch.Tensor,
        shared: SharedPrompts | None = None,
    ) -> None:
        self.rows = rows
        self.cache = cache
        self.shared = shared
        self.mask = mask  # (B, L) long
        self.positions = positions  # (B,) long
        self.last = last  # (B,) long
        self.temperature = torch.tensor([r.sampling.temperature for r in rows])  # (B,)
        self.top_k = torch.tensor([r.sampling.top_k for r in rows], dtype=torch.long)  # (B,)
        self.top_p = torch.tensor([r.sampling.top_p for r in rows])  # (B,)

    @classmethod
    def empty(cls) -> RunningBatch:
        """A batch with no rows and no cache."""
        none = torch.zeros(0, dtype=torch.long)
        return cls([], None, none.reshape(0, 0), none, none)

    @classmethod
    def of_prefill(
        cls, rows: list[Any], prefill: DynamicCache, mask: torch.Tensor, groups: list[int],
        positions: torch.Tensor, own: DynamicCache | None,
        hits: list[PrefixHit | None] | None = None,
    ) -> RunningBatch:
        """Rows whose contexts were prefilled once per distinct context (``prefill``, ``mask``:
        their cache and attention mask; ``groups[b]``: row b's). Where rows share a context and
        ``own`` (an empty cache) is given, the context's keys stay shared (`SharedPrompts`) and
        each row's own cache starts with no column; else each row gets its own copy. When
        contexts were prefilled after cached prefixes (``hits``: a group's next calls, prompts
        whose head was seen) and ``own`` is given, the prefixes' first parts are what is shared
        instead (`split_at_sources`), and each row keeps the rest."""
        layers = list(prefill.layers)
        keys, values = [la.keys for la in layers], [la.values for la in layers]
        split = None if own is None or not hits else split_at_sources(
            keys, values, mask, hits, groups
        )
        if split is not None:
            shared, own_keys, own_values, own_mask = split
            for index, (k, v) in enumerate(zip(own_keys, own_values, strict=True)):
                own.update(k, v, index)
            return cls(rows, own, own_mask, positions, positions, shared)
        if len(rows) == mask.shape[0]:  # every context distinct: nothing to share or copy
            return cls(rows, prefill, mask, positions, positions)
        if own is None:  # a copy per row
            index = torch.tensor(groups, dtype=torch.long)
            for layer in layers:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
            return cls(rows, prefill, mask.index_select(0, index), positions, positions)
        shared = SharedPrompts.of_prefill(
            [la.keys for la in layers], [la.values for la in layers], mask, groups
        )
        for index, layer in enumerate(layers):  # zero columns, the prompts' other dimensions
            empty = layer.keys[:1, :, :0].expand(len(rows), -1, -1, -1)
            own.update(empty, empty, index)
        none = torch.zeros(len(rows), 0, dtype=torch.long)
        return cls(rows, own, none, positions, positions, shared)

    @staticmethod
    def prefill_inputs(rows: list[SequenceState]) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` for rows' contexts."""
        contexts = [r.context for r in rows]
        width = max(len(c) for c in contexts)
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, L)
        mask = torch.zeros(len(rows), width, dtype=torch.long)  # (B, L)
        for b, context in enumerate(contexts):
            n = len(context)
            ids[b, width - n :] = torch.tensor(context, dtype=torch.long)
            mask[b, width - n :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}

    def __len__(self) -> int:
        return len(self.rows)

    def decode_inputs(self) -> dict[str, Any]:
        """Model inputs for one decode step: each row's newest token over the shared cache."""
        ones = torch.ones(len(self.rows), 1, dtype=torch.long)
        return {
            "input_ids": self.last[:, None],  # (B, 1)
            "attention_mask": torch.cat([self.mask, ones], dim=1),  # (B, L + 1)
            "position_ids": self.positions[:, None],  # (B, 1)
            "past_key_values": self.cache,
        }

    def advance(
        self, cache: DynamicCache, attention_mask: torch.Tensor, tokens: torch.Tensor
    ) -> None:
        """Commit a decode step: the fed tokens are now cached and ``tokens`` come next."""
        self.cache = cache
        self.mask = attention_mask
        self.positions = self.positions + 1
        self.last = tokens

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices`` (ascending; their order may change) and drop cache
        columns no remaining row uses, when they are many."""
        if len(indices) == len(self.rows):
            return
        if not indices:
            self.__dict__.update(RunningBatch.empty().__dict__)
            return
        # Finished long rows may leave padding columns every survivor ignores: cut them when
        # they are many (a copy of the cache); else the rows below move into the places of
        # those that left, inside the cache's buffers, and the others stay where they are.
        used = self.mask.index_select(0, torch.tensor(indices)).any(dim=0)
        first = int(used.int().argmax()) if len(used) else 0
        if first >= DECODE_ROOM:
            idx = torch.tensor(indices, dtype=torch.long)
            for layer in _layers(self.cache):
                layer.keys = layer.keys.index_select(0, idx)[:, :, first:]
                layer.values = layer.values.index_select(0, idx)[:, :, first:]
            self._select(indices)
            self.mask = self.mask[:, first:]
            return
        order = fill_order(indices)
        for layer in _layers(self.cache):
            layer.keys = keep_rows(layer.keys, order)
            layer.values = keep_rows(layer.values, order)
        self._select(order)

    def _select(self, order: list[int]) -> None:
        """The per-row state of rows ``order``, in that order."""
        idx = torch.tensor(order, dtype=torch.long)
        self.rows = [self.rows[i] for i in order]
        self.mask = self.mask.index_select(0, idx)
        if self.shared is not None:
            self.shared.select(order)
            if bool((self.shared.groups < 0).all()):
                self.shared = None
        for name in ("positions", "last", "temperature", "top_k", "top_p"):
            setattr(self, name, getattr(self, name).index_select(0, idx))

    def merge(self, other: RunningBatch) -> None:
        """Append ``other``'s rows: into the rows of this cache's buffer that finished rows
        left when they fit, else by concatenation, the shorter cache left-padded."""
        if not other.rows:
            return
        if not self.rows:
            self.__dict__.update(other.__dict__)
            return
        width = max(self.mask.shape[1], other.mask.shape[1])
        pairs = list(zip(_layers(self.cache), _layers(other.cache), strict=True))
        if all(fits(mine.keys, theirs.keys) for mine, theirs in pairs):
            # Into the rows that finished rows left: no copy of the running rows' cache.
            for mine, theirs in pairs:
                mine.keys = append_rows(mine.keys, theirs.keys)
                mine.values = append_rows(mine.values, theirs.values)
            mine_mask = F.pad(self.mask, (0, width - self.mask.shape[1]))  # a gap, if any
            self.mask = torch.cat([mine_mask, F.pad(other.mask, (width - other.mask.shape[1], 0))])
            self._append_rows_of(other)
            return
        for mine, theirs in pairs:
            mine.keys = cat_left_padded(mine.keys, theirs.keys, width)
            mine.values = cat_left_padded(mine.values, theirs.values, width)
        self.mask = cat_left_padded(self.mask, other.mask, width)
        self._append_rows_of(other)

    def _append_rows_of(self, other: RunningBatch) -> None:
        if other.shared is not None:
            self.shared = self.shared or SharedPrompts.unshared(len(self.rows), other.shared)
        if self.shared is not None:
            self.shared.extend(other.shared or SharedPrompts.unshared(len(other.rows), self.shared))
        self.rows = self.rows + other.rows
        for name in ("positions", "last", "temperature", "top_k", "top_p"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))

    def prompt_view(self) -> PromptView | None:
        """What a decode forward's attention reads of the shared prompts (None: none shared)."""
        return None if self.shared is None else self.shared.view()

    @property
    def cache_bytes(self) -> int:
        """Bytes of keys and values the batch holds: each row's own cache (its buffers' room
        included) and the shared prompts."""
        own = sum(
            _storage_bytes(t) for layer in _layers(self.cache) for t in (layer.keys, layer.values)
        )
        return own + (0 if self.shared is None else self.shared.nbytes)

    def row_cache(
        self, index: int, start: int, stop: int, length: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Copies of row ``index``'s per-layer ``(H, stop - start, D)`` keys and values of its
        cached positions ``start`` to ``stop`` (its group's prompt first, then its own); None
        unless the row has cached exactly ``length`` positions."""
        own = self.mask[index].nonzero().squeeze(1)
        group, prompt = (-1, own[:0]) if self.shared is None else self.shared.row_columns(index)
        before = len(prompt)
        if before + len(own) != length:
            return None
        prompt, own = prompt[start:stop], own[max(start - before, 0) : max(stop - before, 0)]
        keys, values = [], []
        for layer, own_layer in enumerate(_layers(self.cache)):
            pieces = []
            if len(prompt):
                assert self.shared is not None
                pieces.append((self.shared.keys[layer][group], self.shared.values[layer][group],
                               prompt))  # fmt: skip
            pieces.append((own_layer.keys[index], own_layer.values[index], own))
            keys.append(_joined([k.index_select(1, at) for k, _, at in pieces]))
            values.append(_joined([v.index_select(1, at) for _, v, at in pieces]))
        return keys, values

    def sample(
        self, logits: torch.Tensor, buffers: SamplingBuffers
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token and its logprob per row, from ``logits`` ``(B, V)``, in ``buffers``."""
        noise = self.noise(logits.shape[-1], out=buffers.take("noise", *logits.shape))
        return sample_next(logits, self.temperature, self.top_k, self.top_p, noise, buffers)

    def noise(self, vocab: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Fresh ``Exp(1)`` noise, ``(B, V)``: each sampling row's from its own generator.

        ``V`` uniforms per row per step from the request's own stream (`next_uniforms`), so a
        seeded request's noise depends on its seed and step alone, whatever batch it runs in.
        The uniforms become exponentials in one batched ``-log(u)``: per-row ``exponential_``
        calls cost 4-8x more on CPU (183 against 50 ms per step at 151k vocab x 64 rows).
        ``u`` starts at float32's smallest normal, so ``-log(u)`` is finite. Greedy rows get
        ones (unused). Written into ``out`` (``(B, V)``) when given.
        """
        ones = torch.full((vocab,), _E_INV)  # -log(1/e) = 1
        uniforms = [
            row.next_uniforms(vocab) if row.sampling.temperature > 0 else ones for row in self.rows
        ]
        return torch.stack(uniforms, out=out).log_().neg_()  # (B, V)


_TINY = torch.finfo(torch.float32).tiny
_AHEAD_STEPS = 16
_AHEAD_FLOATS = 1 << 18  # 1 MiB of uniforms per request at most (one step at a 151k vocab)
_E_INV = 0.36787944117144233  # 1/e


def _layers(cache: DynamicCache | None) -> list[Any]:
    return [] if cache is None else list(cache.layers)


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` end to end along dim 1 (a lone part as it is: no second copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _storage_bytes(t: torch.Tensor) -> int:
    buffer = getattr(t, "_room", t)
    return buffer.numel() * buffer.element_size()
