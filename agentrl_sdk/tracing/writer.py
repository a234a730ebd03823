"""`TraceWriter`: writes built traces to an MLflow store from a child process, in order.

MLflow's store spends ~20-40 ms of Python per trace (SQLAlchemy). Written on a thread of the
training driver, that time competes for the GIL with the next step's rollouts (LangGraph, the
engine's decode loop); in a child process it only shares the CPU. The driver builds the traces
(`build_trace_payload`, cheap) and hands them over; a sender thread pickles them into a pipe,
so `submit` never blocks the event loop. The child answers each batch with how many traces it
wrote or the error it hit, so failures are counted and traces not written by the end are
reported, never dropped silently.

The child is started as ``python -P .../_writer_process.py`` rather than ``multiprocessing``'s
spawn, which would re-run a user's training script that has no ``if __name__ == "__main__"``
guard; it imports MLflow alone, not this package.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from agentrl_sdk.tracing.traces import TracePayload

_WRITER_PROCESS = Path(__file__).with_name("_writer_process.py")
"""The child's program (run as a file: see its docstring)."""

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 120.0
"""How long closing waits for the traces still queued to be written (then they are reported)."""


class TraceWriter:
    """A child process writing trace batches to ``tracking_uri``, started on first use.

    Attributes:
        written: Traces the child wrote.
        errors: Batches the store refused (or the child died before writing).
        lost: Traces of those batches, never written.
    """

    def __init__(self, tracking_uri: str, experiment_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.written = 0
        self.errors = 0
        self.lost = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._results: Connection | None = None
        self._outbox: queue.SimpleQueue[tuple[int, list[TracePayload]] | None] | None = None
        self._sender: threading.Thread | None = None
        self._pending: dict[int, int] = {}  # batch number -> traces in it, until answered
        self._failing = False  # the last answered batch failed
        self._next = 0

    @property
    def pending(self) -> int:
        """Traces submitted and not yet answered for."""
        return sum(self._pending.values())

    def submit(self, traces: Sequence[TracePayload]) -> None:
        """Queue one batch of built traces; returns at once (the sender thread pickles them)."""
        if not traces:
            return
        if self._process is None or self._process.poll() is not None:
            self._start()
        assert self._outbox is not None
        self._next += 1
        self._pending[self._next] = len(traces)
        self._outbox.put((self._next, list(traces)))
        self.poll()

    def poll(self) -> None:
        """Take in the child's answers that have arrived, without waiting."""
        self._receive(deadline=None)

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait up to ``timeout`` s until every submitted batch is answered (written, refused or
        lost with a dead writer); whether none is left pending."""
        self._receive(deadline=time.monotonic() + timeout)
        return not self._pending

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Flush (up to ``timeout`` s), then stop the child; unwritten traces count as lost."""
        if self._process is None:
            return
        self.flush(timeout)
        if self._pending:
            self._give_up(f"not written within {timeout:.0f}s")
        if self._outbox is not None:
            self._outbox.put(None)  # the sender closes the pipe: the child sees EOF and exits
        if self._sender is not None:
            self._sender.join(timeout=5)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        if self._results is not None:
            self._results.close()
        self._process = self._results = self._outbox = self._sender = None

    # --- plumbing ----------------------------------------------------------------------------
    def _start(self) -> None:
        if self._process is not None:  # it died: what it held is lost, a new one takes over
            self._give_up(f"the writer process exited with code {self._process.returncode}")
            self.close(timeout=0)
        work_r, work_w = os.pipe()
        results_r, results_w = os.pipe()
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        self._process = subprocess.Popen(
            [sys.executable, "-P", str(_WRITER_PROCESS), str(work_r), str(results_w),
             self.tracking_uri, self.experiment_id],
            pass_fds=(work_r, results_w), env=env, stdin=subprocess.DEVNULL,
        )
        os.close(work_r)
        os.close(results_w)
        self._results = Connection(results_r, writable=False)
        self._outbox = queue.SimpleQueue()
        self._sender = threading.Thread(
            target=_send_batches, args=(self._outbox, Connection(work_w, readable=False)),
            name="trace-writer-sender", daemon=True,
        )
        self._sender.start()

    def _receive(self, deadline: float | None) -> None:
        """Read answers until none is pending, or none is ready (no deadline), or the deadline."""
        while self._pending and self._results is not None:
            wait = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if not self._results.poll(wait):
                    return
                number, written, error = pickle.loads(self._results.recv_bytes())
            except (EOFError, OSError):
                code = self._process.wait(timeout=10) if self._process else None
                self._give_up(f"the writer process exited with code {code}")
                return
            count = self._pending.pop(number, 0)
            self.written += written
            if error is not None:
                self.errors += 1
                self.lost += count - written
                # Once per outage: a dead store fails every batch until it is back.
                log = logger.debug if self._failing else logger.warning
                log("could not write %d traces to %s: %s (training goes on; failed batches "
                    "are counted in traces/write_errors)", count - written, self.tracking_uri,
                    error)
            self._failing = error is not None

    def _give_up(self, why: str) -> None:
        """Count every unanswered batch as failed and say so."""
        if not self._pending:
            return
        lost = self.pending
        self.errors += len(self._pending)
        self.lost += lost
        self._pending.clear()
        logger.warning("%d traces were not written to %s: %s", lost, self.tracking_uri, why)


def _send_batches(outbox: queue.SimpleQueue, pipe: Connection) -> None:
    """Sender thread: pickle each batch into the pipe (blocking there, not on the event loop)."""
    try:
        while (item := outbox.get()) is not None:
            pipe.send_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # the child died; `TraceWriter` notices on its side of the results pipe
    finally:
        pipe.close()
