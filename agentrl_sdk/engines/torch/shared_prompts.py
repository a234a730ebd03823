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

import torch
import torch.nn.functional as F

__all__ = [
    "PromptView", "SharedPrompts", "attend_with_shared_prompts", "cat_left_padded",
    "serving_prompts",
]


@dataclass
class SharedPrompts:
    """Keys and values of the prompts a running batch's groups share, and which rows use them.

    ``keys``/``values``: per layer ``(G, KV, P, D)``, left-padded; ``mask``: ``(G, P)``, True
    where a prompt has a token. ``groups``: ``(B,)`` each row's group, -1 for a row whose whole
    context is in its own cache; ``members``: ``(B,)`` each row's place within its group
    (distinct among the rows of a group).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    groups: torch.Tensor
    members: torch.Tensor

    @classmethod
    def of_prefill(
        cls, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor,
        groups: list[int],
    ) -> SharedPrompts:
        """Prompts prefilled once each (``mask``: their ``(G, P)`` attention mask), shared by
        rows whose prompt is ``groups[b]``."""
        members, seen = [], [0] * int(mask.shape[0])
        for group in groups:
            members.append(seen[group])
            seen[group] += 1
        groups_t, members_t = torch.tensor(groups), torch.tensor(members)
        return cls(list(keys), list(values), mask.bool(), groups_t, members_t)

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

    def extend(self, other: SharedPrompts) -> None:
        """Append ``other``'s rows and prompts (copies of both tables, left-padded to the wider)."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        offset = self.mask.shape[0]
        self.keys = [
            cat_left_padded(a, b, width) for a, b in zip(self.keys, other.keys, strict=True)
        ]
        self.values = [
            cat_left_padded(a, b, width) for a, b in zip(self.values, other.values, strict=True)
        ]
        self.mask = cat_left_padded(self.mask, other.mask, width)
        shifted = torch.where(other.groups >= 0, other.groups + offset, other.groups)
        self.groups = torch.cat([self.groups, shifted])
        self.members = torch.cat([self.members, other.members])

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
