"""A group's prompt kept once in the decode cache (shared-prefix, or cascade, attention).

The n samples of a group start from the same context. Without sharing, each of the n rows keeps
its own copy of that context's keys and values, and every decode step reads all n copies: at the
real-model demo's shapes (6 groups of 8, ~330 prompt tokens) seven eighths of what a step reads
from the cache are duplicates. Here a group's prompt is stored once (`SharedPrompts`: one row per
group) and each row's own cache holds only what it generated. A decode step scores each row's
query against its group's prompt and against its own tokens, and one softmax over both parts
weighs them: the same attention as over the concatenated row, only summed in another order.

A group's prompt is read once per step for all of its rows: their queries are laid side by side
(`_spread`) so one matmul per group serves them all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentrl_sdk.engines.torch.prefix_cache import PrefixHit

__all__ = [
    "PromptView", "SharedPrompts", "attend_with_shared_prompts", "cat_left_padded",
    "serving_prompts", "split_at_sources",
]


@dataclass
class SharedPrompts:
    """Keys and values of the prompts a running batch's groups share, and which rows use them.

    ``keys``/``values``: per layer ``(G, KV, P, D)``, left-padded; ``mask``: ``(G, P)``, True
    where a prompt has a token. ``groups``: ``(B,)`` each row's group, -1 for a row whose whole
    context is in its own cache; ``members``: ``(B,)`` each row's place within its group
    (distinct among the rows of a group). ``sources``: per prompt, what it is a copy of (a
    prefix-cache entry and its columns, `split_at_sources`; None: a prefill of its own), so
    rows that join with a prompt the table holds use that one.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    groups: torch.Tensor
    members: torch.Tensor
    sources: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.sources is None:
            self.sources = [None] * int(self.mask.shape[0])

    @classmethod
    def of_prefill(
        cls, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor,
        groups: list[int], sources: list[Any] | None = None,
    ) -> SharedPrompts:
        """Prompts prefilled once each (``mask``: their ``(G, P)`` attention mask), shared by
        rows whose prompt is ``groups[b]``."""
        members, seen = [], [0] * int(mask.shape[0])
        for group in groups:  # -1: a row without a shared prompt
            if group < 0:
                members.append(0)
                continue
            members.append(seen[group])
            seen[group] += 1
        groups_t, members_t = torch.tensor(groups), torch.tensor(members)
        return cls(list(keys), list(values), mask.bool(), groups_t, members_t, sources)

    @classmethod
    def unshared(cls, rows: int, like: SharedPrompts) -> SharedPrompts:
        """``rows`` rows that use no shared prompt, beside ``like``'s (an empty table)."""
        empty = [t[:0, :, :0] for t in like.keys], [t[:0, :, :0] for t in like.values]
        none = torch.full((rows,), -1)
        return cls(*empty, like.mask[:0, :0], none, torch.zeros(rows, dtype=torch.long))

    @property
    def nbytes(self) -> int:
        """Bytes of the stored prompts."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def select(self, order: list[int]) -> None:
        """Keep rows ``order``, in that order; drop the prompts no row uses once they are half
        of the table (one copy of the rest)."""
        index = torch.tensor(order, dtype=torch.long)
        self.groups, self.members = self.groups[index], self.members[index]
        used = torch.unique(self.groups[self.groups >= 0])
        if 2 * len(used) > self.mask.shape[0]:
            return
        renumber = torch.full((self.mask.shape[0] + 1,), -1, dtype=torch.long)
        renumber[used] = torch.arange(len(used))
        self.groups = renumber[self.groups]  # -1 indexes the last entry: stays -1
        self.keys = [t.index_select(0, used) for t in self.keys]
        self.values = [t.index_select(0, used) for t in self.values]
        self.mask = self.mask.index_select(0, used)
        self.sources = [self.sources[g] for g in used.tolist()]

    def extend(self, other: SharedPrompts) -> None:
        """Append ``other``'s rows, and the prompts this table does not hold yet (the same
        source: a group's next calls arriving a few at a time) by copying both tables,
        left-padded to the wider."""
        held = {source: g for g, source in enumerate(self.sources) if source is not None}
        assert other.sources is not None
        new = [g for g, source in enumerate(other.sources) if source is None or source not in held]
        renumber = [held.get(source, -1) if source is not None else -1 for source in other.sources]
        for place, g in enumerate(new):
            renumber[g] = self.mask.shape[0] + place
        if new:
            index = torch.tensor(new, dtype=torch.long)
            width = max(self.mask.shape[1], other.mask.shape[1])
            pairs = [(self.keys, other.keys), (self.values, other.values)]
            self.keys, self.values = (
                [cat_left_padded(a, b.index_select(0, index), width) for a, b in zip(*pair)]
                for pair in pairs
            )
            self.mask = cat_left_padded(self.mask, other.mask.index_select(0, index), width)
            self.sources = self.sources + [other.sources[g] for g in new]
        groups = torch.tensor(renumber + [-1])[other.groups]  # -1 picks the last: stays -1
        taken = [int(self.members[self.groups == g].max()) + 1 if bool((self.groups == g).any())
                 else 0 for g in renumber]  # fmt: skip
        first = torch.tensor(taken + [0])[other.groups.clamp(min=0)]  # rows of a held prompt
        self.members = torch.cat([self.members, other.members + first])  # go after its rows
        self.groups = torch.cat([self.groups, groups])

    def row_columns(self, row: int) -> tuple[int, torch.Tensor]:
        """Row ``row``'s group (-1: none) and the prompt columns it attends to."""
        group = int(self.groups[row])
        if group < 0:
            return group, torch.zeros(0, dtype=torch.long)
        return group, self.mask[group].nonzero().squeeze(1)

    def view(self) -> PromptView:
        """What one decode forward needs: each row's slot among the groups' members and mask."""
        groups = self.mask.shape[0]
        width = int(self.members.max()) + 1 if len(self.members) else 1
        dummy = groups * width  # rows without a group score against a zero slot
        slots = torch.where(self.groups >= 0, self.groups * width + self.members, dummy)
        row_mask = self.mask.index_select(0, self.groups.clamp(min=0))
        row_mask &= (self.groups >= 0)[:, None]
        return PromptView(self, slots, width, row_mask)


@dataclass(frozen=True)
class PromptView:
    """A decode forward's reading of `SharedPrompts`: ``slots`` ``(B,)`` in ``[0, G * width]``
    (``G * width``: no group), ``row_mask`` ``(B, P)``: the prompt columns each row sees."""

    prompts: SharedPrompts
    slots: torch.Tensor
    width: int
    row_mask: torch.Tensor


_SERVING: ContextVar[PromptView | None] = ContextVar("agentrl_shared_prompts", default=None)


@contextlib.contextmanager
def serving_prompts(view: PromptView | None) -> Iterator[None]:
    """Make the attention of the forwards inside read ``view``'s shared prompts."""
    token = _SERVING.set(view)
    try:
        yield
    finally:
        _SERVING.reset(token)


def current_prompts() -> PromptView | None:
    """The shared prompts of the decode forward running in this context, if any."""
    return _SERVING.get()


def attend_with_shared_prompts(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    own_mask: torch.Tensor,
    scaling: float,
    view: PromptView,
    layer: int,
) -> torch.Tensor:
    """One decode step's attention of ``(B, H, 1, D)`` queries over each row's group prompt
    (layer ``layer`` of ``view``) followed by its own ``(B, KV, L, D)`` keys and values.
    ``own_mask``: ``(B, 1, 1, L)``, boolean (True attends) or additive. Scores and softmax in
    float32; returns ``(B, 1, H, D)``."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    per_kv = heads // kv_heads
    shared_keys, shared_values = view.prompts.keys[layer], view.prompts.values[layer]
    query = query.reshape(batch, kv_heads, per_kv, dim)  # one query a row
    # The prompt part: each group's prompt read once for all its rows' queries.
    spread = _spread(query, view)  # (G, KV, width * per_kv, D)
    shared = torch.matmul(shared_keys, spread.transpose(-1, -2))  # (G, KV, P, width * per_kv)
    shared = _gather(shared.transpose(-1, -2), view, per_kv)  # (B, KV, per_kv, P)
    own = torch.matmul(key, query.transpose(-1, -2)).transpose(-1, -2)  # (B, KV, per_kv, L)
    prompt_width = shared.shape[-1]
    scores = torch.cat([shared, own], dim=-1).to(torch.float32).mul_(scaling)
    lowest = torch.finfo(torch.float32).min
    scores[..., :prompt_width].masked_fill_(~view.row_mask[:, None, None, :], lowest)
    if own_mask.dtype == torch.bool:
        scores[..., prompt_width:].masked_fill_(~own_mask, lowest)
    else:
        scores[..., prompt_width:].add_(own_mask)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    shared_weights = _spread(weights[..., :prompt_width], view)  # (G, KV, width * per_kv, P)
    out = _gather(torch.matmul(shared_weights, shared_values), view, per_kv)  # (B, KV, per_kv, D)
    out = out + torch.matmul(weights[..., prompt_width:], value)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2)


def _spread(rows: torch.Tensor, view: PromptView) -> torch.Tensor:
    """``(B, KV, per_kv, X)`` per row -> ``(G, KV, width * per_kv, X)`` per group, each row in
    its slot (empty slots zero; rows without a group dropped)."""
    batch, kv_heads, per_kv, x = rows.shape
    groups = view.prompts.mask.shape[0]
    out = rows.new_zeros(groups * view.width + 1, kv_heads, per_kv, x)
    out.index_copy_(0, view.slots, rows)
    out = out[:-1].view(groups, view.width, kv_heads, per_kv, x).transpose(1, 2)
    return out.reshape(groups, kv_heads, view.width * per_kv, x)


def _gather(groups: torch.Tensor, view: PromptView, per_kv: int) -> torch.Tensor:
    """The inverse of `_spread`: ``(G, KV, width * per_kv, X)`` -> ``(B, KV, per_kv, X)``,
    zeros for rows without a group."""
    count, kv_heads, _, x = groups.shape
    slots = groups.view(count, kv_heads, view.width, per_kv, x).transpose(1, 2)
    slots = F.pad(slots.reshape(count * view.width, kv_heads, per_kv, x), (0, 0, 0, 0, 0, 0, 0, 1))
    return slots.index_select(0, view.slots)


def split_at_sources(
    keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor,
    hits: list[PrefixHit | None], contexts: list[int],
) -> tuple[SharedPrompts, list[torch.Tensor], list[torch.Tensor], torch.Tensor] | None:
    """Contexts prefilled after their cached prefixes (``keys``/``values`` per layer, ``mask``:
    `inputs_after_prefixes`' layout), split where their hits' first parts end: each distinct
    first part (the prompt's head a group's rows, or all rows, start with) stored once as a
    shared prompt, and per row (``contexts[b]``: row b's context) the rest of its context,
    left-padded. Returns the prompts, the rows' own keys, values and mask; None when no hit
    has a first part to share."""
    # Rows of one source share the first columns all of their first parts have: per source,
    # the hit whose first part is the shortest.
    slots: dict[Any, int] = {}
    firsts: list[PrefixHit] = []
    groups = []
    for hit in hits:
        if hit is None:
            groups.append(-1)
            continue
        slot = slots.setdefault(hit.source, len(firsts))
        if slot == len(firsts):
            firsts.append(hit)
        elif hit.first_width < firsts[slot].first_width:
            firsts[slot] = hit
        groups.append(slot)
    if not firsts:
        return None
    shared = [0 if g < 0 else firsts[g].first_width for g in groups]
    longest = max(first.first_width for first in firsts)
    lengths = torch.tensor([0 if h is None else h.length for h in hits])
    start = int(lengths.max()) - lengths + torch.tensor(shared)  # (B,) first own column
    own = mask.shape[1] - start
    width = int(own.max())
    columns = torch.arange(width)[None, :] + (start - width + own)[:, None]  # (B, W)
    inside = columns >= start[:, None]
    columns = torch.where(inside, columns, 0)  # padding reads column 0: finite, masked out

    rows = torch.tensor(contexts, dtype=torch.long)
    columns, inside = columns.index_select(0, rows), inside.index_select(0, rows)

    def rest(t: torch.Tensor) -> torch.Tensor:
        t = t if len(rows) == len(t) else t.index_select(0, rows)  # a copy per row of a context
        return t.gather(2, columns[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))

    def table(layer: int, which: int) -> torch.Tensor:
        parts = [F.pad(first.parts[0][which][layer], (0, 0, longest - first.first_width, 0))
                 for first in firsts]  # fmt: skip
        return torch.stack(parts)  # (G, KV, P, D)

    table_mask = torch.zeros(len(firsts), longest, dtype=torch.bool)
    for g, first in enumerate(firsts):
        table_mask[g, longest - first.first_width :] = True
    prompts = SharedPrompts.of_prefill(
        [table(i, 0) for i in range(len(keys))], [table(i, 1) for i in range(len(keys))],
        table_mask, [groups[c] for c in contexts],
        [(first.source, first.first_width) for first in firsts],
    )
    own_mask = mask.index_select(0, rows).gather(1, columns) * inside
    return prompts, [rest(k) for k in keys], [rest(v) for v in values], own_mask


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence axis (dim 1 of a mask, dim 2 of ``(B, H, L, D)`` keys) to ``width``."""
    missing = width - (t.shape[1] if t.dim() == 2 else t.shape[2])
    if missing == 0:
        return t
    pad = (missing, 0) if t.dim() == 2 else (0, 0, missing, 0)
    return F.pad(t, pad)


def cat_left_padded(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """``a``'s rows then ``b``'s, each left-padded to ``width`` (`_pad_left`)."""
    return torch.cat([_pad_left(a, width), _pad_left(b, width)])
