"""The trace writer's child process: write each batch of trace payloads it is sent, answer, repeat.

    python -P .../agentrl_sdk/tracing/_writer_process.py WORK_FD RESULTS_FD TRACKING_URI EXPERIMENT_ID

It runs as a file and imports only the standard library and MLflow, never ``agentrl_sdk``
(whose package imports torch and LangGraph): the child holds ~0.2 GB instead of ~0.5 GB.
``-P``: its folder does not go on ``sys.path`` (its sibling ``html.py`` would shadow the
standard library's).

Reads pickled ``(batch number, [TracePayload, ...])`` from ``WORK_FD`` and answers each with a
pickled ``(batch number, traces written, error or None)`` on ``RESULTS_FD``. It exits when the
driver closes the work pipe (end of the run, or the driver died). Ctrl+C in the terminal goes
to the whole process group: the child ignores it, so the driver can still flush what it sent.
"""

from __future__ import annotations

import pickle
import signal
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any


def main(work_fd: int, results_fd: int, tracking_uri: str, experiment_id: str) -> None:
    """Serve until the work pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    work = Connection(work_fd, writable=False)
    results = Connection(results_fd, readable=False)
    while True:
        try:
            number, traces = pickle.loads(work.recv_bytes())
        except EOFError:
            return
        try:
            write_traces(tracking_uri, experiment_id, traces)
            answer = (number, len(traces), None)
        except Exception as error:  # reported to the driver, which counts it
            answer = (number, 0, f"{type(error).__name__}: {error}"[:2000])
        results.send_bytes(pickle.dumps(answer))


def write_traces(tracking_uri: str, experiment_id: str, traces: Sequence[tuple[Any, Any]]) -> None:
    """Log built traces (entities or payloads): each trace's info, then every span in one batch.

    Info first: MLflow's store then inserts each trace row once, where spans first would make
    every ``start_trace`` roll back its insert and merge into the row ``log_spans`` created
    (about twice the time).
    """
    from mlflow.entities import Span
    from mlflow.tracing.client import TracingClient

    if not traces:
        return
    client = TracingClient(tracking_uri)
    for info, _ in traces:
        client.start_trace(info)
    client.log_spans(experiment_id, [span if isinstance(span, Span) else Span.from_dict(span)
                                     for _, spans in traces for span in spans])


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
