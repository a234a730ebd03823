"""`WriteBuffer`: tracking writes done in order on a background thread, retried through outages.

Training must never wait on, or die of, its tracking server. Every MLflow write after the run
is open (metrics, params, artifacts, the run's end) is handed to this buffer and returns at
once; a thread performs them in order. A write that fails because the store is unreachable
stays at the head and is retried with backoff (the outage is warned about once and every
failed attempt counted); one the store refuses outright (a bad value) is dropped and counted.
Writes still pending when the buffer closes are dropped, counted and reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["WriteBuffer"]

CAPACITY = 10_000
"""Writes held at most; past it, new writes are dropped (and counted) until the store is back."""

_REFUSED = frozenset({
    "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
    "BAD_REQUEST", "INVALID_STATE", "PERMISSION_DENIED", "UNAUTHENTICATED",
})  # fmt: skip
"""MLflow error codes that retrying cannot fix: the write is dropped, not retried."""


@dataclass
class _Write:
    what: str
    call: Callable[[], object]


class WriteBuffer:
    """An ordered queue of writes to one tracking store, drained by a daemon thread.

    Args:
        target: The store, named in warnings (the tracking URI).
        backoff_s: First and longest wait between attempts while the store is unreachable.

    Attributes:
        failed_writes: Attempts that failed (each retry of a write during an outage counts).
        dropped_writes: Writes given up: refused by the store, over capacity, or still pending
            when the buffer closed.
    """

    def __init__(self, target: str, backoff_s: tuple[float, float] = (1.0, 30.0)) -> None:
        self.target = target
        self.failed_writes = 0
        self.dropped_writes = 0
        self._backoff_s = backoff_s
        self._writes: deque[_Write] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._busy = False  # a write is being attempted (it is still at the head)
        self._outage = False
        self._thread = threading.Thread(target=self._drain, name="tracking-writes", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Writes not done yet."""
        return len(self._writes)

    @property
    def in_outage(self) -> bool:
        """Whether the last attempt failed (the store looks unreachable)."""
        return self._outage

    def submit(self, what: str, call: Callable[[], object]) -> None:
        """Queue ``call`` (described by ``what`` in warnings); returns at once."""
        with self._changed:
            if self._closing or len(self._writes) >= CAPACITY:
                self.dropped_writes += 1
                return
            self._writes.append(_Write(what, call))
            self._changed.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every queued write; whether none is left."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._writes and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return not self._writes

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` s, then stop; what is left is dropped and reported."""
        self.flush(timeout)
        with self._changed:
            self._closing = True
            left = len(self._writes) - self._busy
            self.dropped_writes += left
            while len(self._writes) > self._busy:
                self._writes.pop()
            self._changed.notify_all()
        if left:
            logger.warning("%d tracking writes to %s were not done within %.0fs: dropped "
                           "(training results are unaffected)", left, self.target, timeout)
        self._thread.join(timeout=1.0)

    def _drain(self) -> None:
        wait = self._backoff_s[0]
        while True:
            with self._changed:
                while not self._writes and not self._closing:
                    self._changed.wait()
                if not self._writes:
                    return
                write, self._busy = self._writes[0], True
            error: Exception | None = None
            try:
                write.call()
            except Exception as exc:  # noqa: BLE001 - a tracking failure must never reach training
                error = exc
            with self._changed:
                self._busy = False
                if error is None or _refused(error):
                    self._writes.popleft()
                if error is None:
                    if self._outage:
                        logger.warning("tracking at %s answers again; catching up on %d writes",
                                       self.target, len(self._writes))
                    self._outage, wait = False, self._backoff_s[0]
                    self._changed.notify_all()
                    continue
                self.failed_writes += 1
                if _refused(error):
                    self.dropped_writes += 1
                    logger.warning("tracking at %s refused %s: %s", self.target, write.what, error)
                    self._changed.notify_all()
                    continue
                if not self._outage:
                    logger.warning(
                        "tracking at %s failed (%s: %s); training goes on, writes are buffered "
                        "and retried (counted in tracking/failed_writes)", self.target,
                        write.what, _first_line(error),
                    )  # fmt: skip
                self._outage = True
                if self._closing:
                    self._writes.popleft()
                    self.dropped_writes += 1
                    continue
                until = time.monotonic() + wait  # close() cuts the wait short
                while not self._closing and (left := until - time.monotonic()) > 0:
                    self._changed.wait(left)
                wait = min(wait * 2, self._backoff_s[1])


def _refused(error: BaseException) -> bool:
    return getattr(error, "error_code", None) in _REFUSED


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
