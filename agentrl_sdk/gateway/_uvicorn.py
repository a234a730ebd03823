"""uvicorn's server made to run as one task of someone else's event loop."""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import uvicorn


class InLoopServer(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C belongs to the process that embeds it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install nothing."""
        yield
