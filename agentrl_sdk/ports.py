"""A free TCP port, for what the SDK listens on or starts: vLLM's and MLflow's servers, the
trainer ranks' rendezvous. Below every layer, so that engines, tracing and trainer share it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at the moment on ``host`` (``""``: every interface)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
