"""`agentrl ui`: the MLflow UI over the project's store on 127.0.0.1, its link printed, stopped
cleanly by SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_store_on_loopback_and_prints_the_link(tmp_path):
    port = _free_port()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "agentrl"), "ui", "--uri", uri, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    try:
        link = None
        deadline = time.monotonic() + 180
        while link is None and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            found = re.search(r"MLflow UI: (http://\S+)", log.read_text())
            link = found.group(1) if found else None
            time.sleep(0.5)
        assert link == f"http://127.0.0.1:{port}", log.read_text()
        assert httpx.get(link, timeout=30).status_code == 200
        experiments = httpx.get(f"{link}/api/2.0/mlflow/experiments/search",
                                params={"max_results": 10}, timeout=30)  # fmt: skip
        assert experiments.status_code == 200
        assert "Default" in experiments.text  # the sqlite store it was given
        outside = _outside_address()
        if outside is not None:
            with pytest.raises(httpx.ConnectError):  # loopback only
                httpx.get(f"http://{outside}:{port}", timeout=5)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    assert process.returncode == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(link, timeout=5)  # stopped with the command


def _outside_address() -> str | None:
    """This machine's address on its network, or None without one besides loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address
