"""Threads of the SDK and of user code, kept apart so a stuck tool cannot stall training.

LangChain and ``asyncio.to_thread`` run synchronous tools and agent functions on the event
loop's default executor. A tool that never returns keeps its thread for good: a few of them
used to leave no thread for the trainer update, the weight sync or a checkpoint, and the
stuck threads kept the process from exiting. So the SDK's own blocking calls run on threads
of their own (`run_blocking`), and a job installs `UserCodeExecutor` as its loop's default
executor (`use_user_code_executor`): bounded, and never waited for at shutdown.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import _worker  # type: ignore[attr-defined]
from typing import ParamSpec, TypeVar

__all__ = ["UserCodeExecutor", "run_blocking", "use_user_code_executor"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Few blocking SDK calls run at once (one update or push per policy, a checkpoint).
_SDK_THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agentrl-sdk")


async def run_blocking(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``await asyncio.to_thread(fn, ...)``, but on the SDK's own threads (context kept)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_SDK_THREADS, call)


class UserCodeExecutor(ThreadPoolExecutor):
    """A bounded pool for user code (sync tools, sync agent functions) whose threads never
    hold up a shutdown: they are daemon threads, and ``shutdown`` does not wait for them.

    A stuck call keeps its thread (Python cannot kill a thread); the others keep working on
    the rest, and when every thread is stuck new calls queue until their rollout times out.
    It subclasses ``ThreadPoolExecutor`` because asyncio takes no other default executor, and
    starts its threads itself (CPython 3.11's worker loop) to make them daemons.
    """

    def _adjust_thread_count(self) -> None:
        if self._idle_semaphore.acquire(timeout=0):
            return

        def wake(_: object, q: object = self._work_queue) -> None:
            q.put(None)  # type: ignore[attr-defined]

        if len(self._threads) < self._max_workers:
            thread = threading.Thread(
                name=f"{self._thread_name_prefix}_{len(self._threads)}", target=_worker,
                args=(weakref.ref(self, wake), self._work_queue, self._initializer,
                      self._initargs),
                daemon=True,
            )
            thread.start()
            self._threads.add(thread)  # not in the interpreter's join-at-exit list

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; never waits (a stuck tool would make it wait forever)."""
        super().shutdown(wait=False, cancel_futures=cancel_futures)


def use_user_code_executor(max_workers: int) -> None:
    """Make a `UserCodeExecutor` of ``max_workers`` threads the running loop's default
    executor (once per loop): where LangChain runs sync tools and ``asyncio.to_thread`` runs."""
    loop = asyncio.get_running_loop()
    if not isinstance(getattr(loop, "_default_executor", None), UserCodeExecutor):
        loop.set_default_executor(UserCodeExecutor(max_workers, thread_name_prefix="agentrl-tool"))
