"""`LoopThread`: a private event loop in a daemon thread, for clients bound to one loop.

vLLM's `AsyncLLM` and an `httpx.AsyncClient` belong to the loop that created them, while our
engines may be awaited from any loop in any thread (rollouts under sync ``invoke`` run their
own ``asyncio.run``). Each such engine owns one `LoopThread` and hands coroutines to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "called"]

T = TypeVar("T")


class LoopThread:
    """Runs an event loop forever in a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        """True until `stop`."""
        return self._thread.is_alive() and not self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block the calling thread for its result.

        Raises:
            TimeoutError: It took longer than ``timeout`` seconds (it is cancelled).
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` from any other loop; cancelling the caller cancels it on this loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop after cancelling its tasks, and join the thread."""
        if not self._thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=timeout) if tasks else None

        try:
            self.run(cancel_all(), timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.loop.close()


async def called(fn: Callable[[], T]) -> T:
    """``fn()`` as a coroutine: a plain call for `LoopThread.run` or `LoopThread.call` to make
    on the loop."""
    return fn()
