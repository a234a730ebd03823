"""`ServedTraces`: one MLflow trace per served request, written off the request path.

A request only hands its finished trajectory over (a queue put); a thread of its own builds the
trace (`build_trace_payload`, the same trace a training rollout gets, tagged ``phase=serve``)
and passes it to the run's `TraceWriter`, whose child process writes to MLflow. A slow or
unreachable store therefore never delays a request: traces queue up to
``max_pending`` (past it they are dropped), a write the store refuses is lost, and both are
counted (`counts`) and warned about, never dropped silently.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Mapping
from typing import Any

from agentrl_sdk.errors import TrackingError
from agentrl_sdk.tracing.traces import TracePayload, build_trace_payload
from agentrl_sdk.tracing.view import mlflow_client
from agentrl_sdk.tracing.writer import TraceWriter
from agentrl_sdk.types import Trajectory

__all__ = ["ServedTraces", "open_experiment"]

logger = logging.getLogger(__name__)

_BATCH = 64
"""Most traces handed to the writer at once (a busy server writes them in batches)."""
_POLL_S = 0.2
"""How often the thread takes in the writer's answers while no request comes."""

_Item = tuple[Trajectory, int, dict[str, str]]


def open_experiment(tracking_uri: str, experiment: str, timeout_s: float = 10.0) -> str:
    """The id of ``experiment`` in the store (created when missing), in one attempt.

    Raises:
        TrackingError: the store cannot be reached or refuses, with its URI in the message.
    """
    client = mlflow_client(tracking_uri, timeout_s)
    try:
        found = client.get_experiment_by_name(experiment)
        return found.experiment_id if found else client.create_experiment(experiment)
    except Exception as exc:
        raise TrackingError(
            f"cannot open MLflow experiment {experiment!r} at {tracking_uri!r}: "
            f"{str(exc).strip()[:300]} - is the tracking server up? (or serve with "
            "tracking_uri=None to serve without traces)"
        ) from exc


class ServedTraces:
    """Builds and writes the traces of served requests on a thread of its own.

    Args:
        tracking_uri: The MLflow store.
        experiment_id: The experiment the traces belong to (`open_experiment`).
        tokenizer: Decodes the ids into the spans' text and names the vocabulary.
        tags: Tags on every trace.
        max_pending: Most traces queued or being written; past it new ones are dropped.
    """

    def __init__(self, tracking_uri: str, experiment_id: str, tokenizer: Any, *,
                 tags: Mapping[str, str] | None = None, max_pending: int = 10_000) -> None:
        self.experiment_id = experiment_id
        self.tokenizer = tokenizer
        self.tags = dict(tags or {})
        self.max_pending = max_pending
        self._writer = TraceWriter(tracking_uri, experiment_id)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # handed over, not yet given to the writer
        self._in_writer = 0  # given to the writer, not yet answered for
        self._dropped = 0
        self._unbuilt = 0
        self._written = self._lost = self._errors = 0
        self._thread = threading.Thread(target=self._run, name="agentrl-serve-traces",
                                        daemon=True)
        self._thread.start()

    def record(self, trajectory: Trajectory, trace_id: int, tags: Mapping[str, str]) -> bool:
        """Queue the trace of a finished request; returns at once. False when it was dropped
        (``max_pending`` traces are waiting already): counted in ``traces_dropped``."""
        with self._lock:
            if self._queued + self._in_writer >= self.max_pending:
                self._dropped += 1
                first = self._dropped == 1
            else:
                self._queued += 1
                first = None
        if first is None:
            self._queue.put((trajectory, trace_id, {**self.tags, **tags}))
            return True
        (logger.warning if first else logger.debug)(
            "%d traces are waiting to be written: dropping this request's trace (counted in "
            "traces_dropped; the store is slow or down)", self.max_pending)
        return False

    def record_rollout(self, trajectory: Trajectory) -> None:
        """Queue the trace of a gateway rollout its client closed (the hook
        `Gateway(on_client_close=...)` takes): tagged with its ``rollout_id``."""
        rollout_id = trajectory.row_id
        self.record(trajectory, random.getrandbits(128),
                    {"rollout_id": rollout_id, "mlflow.traceName": f"rollout {rollout_id}"})

    @property
    def counts(self) -> dict[str, int]:
        """``traces_written``, ``traces_pending`` (queued or being written),
        ``traces_dropped`` (queue full), ``traces_lost`` (refused by the store, unwritten at
        close, or not buildable) and ``trace_write_errors`` (failed batches)."""
        with self._lock:
            return {"traces_written": self._written,
                    "traces_pending": self._queued + self._in_writer,
                    "traces_dropped": self._dropped, "traces_lost": self._lost + self._unbuilt,
                    "trace_write_errors": self._errors}

    def close(self, timeout: float = 30.0) -> dict[str, int]:
        """Write what is queued (up to ``timeout`` s; the rest counts as lost), stop; the
        final `counts`."""
        self._queue.put(None)
        self._thread.join()
        self._writer.close(timeout)
        self._take_counts()
        return self.counts

    # --- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                self._writer.poll()
                self._take_counts()
                continue
            if item is None:
                return
            items = [item]
            while len(items) < _BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                items.append(more)
            payloads = [p for p in map(self._build, items) if p is not None]
            with self._lock:  # moved from queued to the writer at once: `record` sees no gap
                self._queued -= len(items)
                self._in_writer += len(payloads)
                self._unbuilt += len(items) - len(payloads)
            self._writer.submit(payloads)
            self._take_counts()

    def _build(self, item: _Item) -> TracePayload | None:
        trajectory, trace_id, tags = item
        try:
            return build_trace_payload(trajectory, experiment_id=self.experiment_id, step=None,
                                       tokenizer=self.tokenizer, phase="serve",
                                       trace_id=trace_id, tags_extra=tags)
        except Exception:  # noqa: BLE001 - a trace that cannot be built is counted, not raised
            logger.exception("the trace of request %s could not be built", trajectory.row_id)
            return None

    def _take_counts(self) -> None:
        with self._lock:
            self._in_writer = self._writer.pending
            self._written, self._lost = self._writer.written, self._writer.lost
            self._errors = self._writer.errors
