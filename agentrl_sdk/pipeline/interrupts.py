"""Ctrl-C for the training pipelines: the first one stops the run soon with a consistent
checkpoint, a second one at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

__all__ = ["Stopped", "stop_on_interrupt", "unless_stopped"]

T = TypeVar("T")


class Stopped(Exception):
    """The run was asked to stop while waiting for work that is safe to drop (rollouts not
    trained on yet): the pipeline checkpoints what it finished and ends."""


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[asyncio.Event]:
    """An event set by the first Ctrl-C (SIGINT); the handler is then removed, so a second
    Ctrl-C raises KeyboardInterrupt at once. Outside the main thread, Ctrl-C is left alone."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):
        installed = False
    try:
        yield stop
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T:
    """``work``'s result, or `Stopped` (``work`` cancelled) if ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: the work goes too
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise Stopped
