"""Python's cyclic garbage collector, relaxed while rollouts run.

Each young collection moves the objects of every in-flight rollout (graph state, messages,
LangChain runs) into older generations, which are rescanned again and again: with a thousand
rollouts at once the collector's cost per rollout grows with the number of rollouts
(`benchmarks/scaling.py`, null engine: 3.7 -> 10 ms per rollout from 64 to 2,048 at once;
flat with collections as rare as below). While any batch runs, the young generation's
threshold is raised from CPython's 700 allocations to `YOUNG_THRESHOLD` (garbage cycles wait a
little longer; reference counting frees everything else at once, as always); the previous
thresholds come back when the last batch ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

YOUNG_THRESHOLD = 200_000
"""Allocations between young collections while rollouts run."""

_lock = threading.Lock()
_running = 0
_saved: tuple[int, ...] = ()


@contextlib.contextmanager
def relaxed_gc() -> Iterator[None]:
    """Raise the young generation's threshold while the block runs (nests, thread-safe).

    A threshold of 0 (collection disabled) or above `YOUNG_THRESHOLD` is left alone.
    """
    global _running, _saved
    with _lock:
        if _running == 0:
            _saved = gc.get_threshold()
            if 0 < _saved[0] < YOUNG_THRESHOLD:
                gc.set_threshold(YOUNG_THRESHOLD, *_saved[1:])
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0:
                gc.set_threshold(*_saved)
