"""The trace writer's child process: write each batch of trace payloads it is sent, answer, repeat.

    python -m agentrl_sdk.tracing._writer_process WORK_FD RESULTS_FD TRACKING_URI EXPERIMENT_ID

Reads pickled ``(batch number, [TracePayload, ...])`` from ``WORK_FD`` and answers each with a
pickled ``(batch number, traces written, error or None)`` on ``RESULTS_FD``. It exits when the
driver closes the work pipe (end of the run, or the driver died). Ctrl+C in the terminal goes
to the whole process group: the child ignores it, so the driver can still flush what it sent.
"""

from __future__ import annotations

import pickle
import signal
import sys
from multiprocessing.connection import Connection


def main(work_fd: int, results_fd: int, tracking_uri: str, experiment_id: str) -> None:
    """Serve until the work pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from agentrl_sdk.tracing.traces import write_traces

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


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
