"""uvicorn's server made to run as one task of someone else's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn

from agentrl_sdk.errors import AgentRLError


class InLoopServer(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C belongs to the process that embeds it.

    It serves ``app`` as a task of the running loop; ``what`` names it in errors.
    """

    def __init__(self, app: Any, host: str, port: int, what: str) -> None:
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                        access_log=False, lifespan="off"))
        self.what = what
        self.task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install nothing."""
        yield

    async def listen(self, task_name: str, timeout_s: float) -> int:
        """Serve as a task of the running loop; its port, once the socket accepts connections."""
        task = self.task = asyncio.create_task(self.serve(), name=task_name)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.started:
            if task.done():
                await task  # raises the reason it stopped (e.g. the port is taken)
                raise AgentRLError(f"{self.what} stopped while starting on "
                                   f"{self.config.host}:{self.config.port}")
            if asyncio.get_running_loop().time() > deadline:
                await self.stop()
                raise AgentRLError(f"{self.what} did not listen within {timeout_s}s")
            await asyncio.sleep(0.005)
        return self.servers[0].sockets[0].getsockname()[1]

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop listening; connections still open are closed after ``timeout_s``."""
        if self.task is None:
            return
        self.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout_s)
        except TimeoutError:
            self.force_exit = True
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.task = None
