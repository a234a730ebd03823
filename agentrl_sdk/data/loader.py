"""`RowLoader`: seeded, epoch-shuffled batches of rows with a position that checkpoints can save."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel


class LoaderPosition(BaseModel):
    """Where the loader is: resuming from it yields exactly the batches that would have come."""

    epoch: int = 0
    index: int = 0


class RowLoader:
    """Batches of ``batch_size`` rows, reshuffled each epoch with ``seed + epoch``.

    A batch never spans two epochs; the last partial batch of an epoch is dropped so every
    step sees the same number of rows.
    """

    def __init__(
        self, rows: list[dict[str, Any]], batch_size: int, *, shuffle: bool = True, seed: int = 0
    ) -> None:
        if batch_size > len(rows):
            raise ValueError(
                f"batch_size ({batch_size}) is larger than the dataset ({len(rows)} rows)"
            )
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.position = LoaderPosition()

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[dict[str, Any]]:
        """The next batch; advances the position."""
        pos = self.position
        if pos.index + self.batch_size > len(self.rows):
            pos = LoaderPosition(epoch=pos.epoch + 1, index=0)
        order = self._order(pos.epoch)
        batch = [self.rows[i] for i in order[pos.index : pos.index + self.batch_size]]
        self.position = LoaderPosition(epoch=pos.epoch, index=pos.index + self.batch_size)
        return batch

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        while True:
            yield self.next_batch()
