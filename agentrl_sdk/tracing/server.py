"""`MlflowServer`: the MLflow tracking server and UI on loopback, for `agentrl ui` and tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agentrl_sdk.ports import free_port


def trace_url(base_url: str, experiment_id: str, trace_id: str | None = None) -> str:
    """The MLflow UI page of an experiment's traces, or of one trace."""
    url = f"{base_url}/#/experiments/{experiment_id}/traces"
    return f"{url}?selectedEvaluationId={trace_id}" if trace_id else url


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 over a backend store, one worker, no telemetry.

    Use as a context manager (started and healthy inside, stopped on exit) or call
    `start`/`wait`/`stop`.

    Args:
        backend_store_uri: Where runs and traces live, e.g. ``sqlite:///mlflow.db``.
        port: Port to listen on; a free one when None.
        artifacts_dir: Folder the server keeps artifacts in (``--artifacts-destination``);
            next to a sqlite file by default.
        log_path: File that receives the server's output; discarded when None.
    """

    def __init__(self, backend_store_uri: str, port: int | None = None,
                 artifacts_dir: str | Path | None = None, log_path: str | Path | None = None):
        self.backend_store_uri = backend_store_uri
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir else _default_artifacts(
            backend_store_uri)
        self.log_path = Path(log_path) if log_path else None
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
            "--port", str(self.port), "--backend-store-uri", self.backend_store_uri,
            "--artifacts-destination", str(self.artifacts_dir), "--workers", "1",
        ]

    def start(self) -> MlflowServer:
        """Start the server process (returns at once; `wait` for it to answer)."""
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        self._process = subprocess.Popen(self.command(), env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait(self, timeout_s: float = 90.0) -> None:
        """Block until ``/health`` answers.

        Raises:
            RuntimeError: the server exited, or did not answer within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with code {self._process.returncode}; "
                    f"see {self.log_path or 'its output'} (command: {' '.join(self.command())})"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server at {self.url} did not answer within {timeout_s}s")

    def join(self) -> int:
        """Block until the server exits; its exit code."""
        if self._process is None:
            raise RuntimeError("the server was not started")
        return self._process.wait()

    def stop(self) -> None:
        """Stop the server and its workers."""
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, 15)
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, 9)
            self._process.wait()

    def __enter__(self) -> MlflowServer:
        self.start()
        try:
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _default_artifacts(uri: str) -> Path:
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts"
    return Path("mlartifacts").resolve()
