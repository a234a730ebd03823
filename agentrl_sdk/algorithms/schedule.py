"""The learning-rate schedule of the trainer and of the warm start: linear warmup, then
constant or a cosine decay to a floor."""

from __future__ import annotations

import math

__all__ = ["warmup_cosine"]


def warmup_cosine(step: int, *, warmup: int, total: int | None, floor: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    ``(step + 1) / warmup`` for ``step < warmup``; then ``1`` when ``total`` is None (constant),
    else ``floor + (1 - floor) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup) / (total - warmup)`` capped at 1.
    """
    if step < warmup:
        return (step + 1) / warmup
    if total is None:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * cosine
