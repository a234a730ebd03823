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
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

__all__ = ["RAY_SUBMIT_LOCK", "UserCodeExecutor", "run_blocking", "use_user_code_executor"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Few blocking SDK calls run at once (one update or push per policy, a checkpoint).
_SDK_THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agentrl-sdk")

RAY_SUBMIT_LOCK = threading.Lock()
"""Held while a thread hands arguments to Ray (``actor.method.remote(...)``): Ray's driver
aborted ("owned object already exists") when two threads submitted large arguments at once
(two trainer groups updating side by side)."""


async def run_blocking(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``await asyncio.to_thread(fn, ...)``, but on the SDK's own threads (context kept)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_SDK_THREADS, call)


class UserCodeExecutor(ThreadPoolExecutor):
    """A bounded pool for user code (sync tools, sync agent functions) whose threads never
    hold up a shutdown: they are daemon threads, and ``shutdown`` does not wait for them.

    A stuck call keeps its thread (Python cannot kill a thread); the others keep working on
    the rest, and when every thread is stuck new calls queue until their rollout times out.
    A thread idle for ``idle_s`` seconds ends (a pool nobody shuts down, such as a finished
    job's `ToolNode`'s, holds no threads, nor the OpenMP teams of tools that ran torch).
    It subclasses ``ThreadPoolExecutor`` only because asyncio takes no other default
    executor; the queue and the (daemon) threads are its own.
    """

    def __init__(
        self, max_workers: int, thread_name_prefix: str = "agentrl-user", idle_s: float = 30.0
    ) -> None:
        super().__init__(max_workers, thread_name_prefix)  # sets _max_workers; starts nothing
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._daemons: list[threading.Thread] = []
        self._idle = 0
        self._idle_s = idle_s
        self._started = itertools.count()
        self._closed = False

    def submit(self, fn: Callable[..., _T], /, *args: object, **kwargs: object) -> Future[_T]:
        """Run ``fn(*args, **kwargs)`` on one of the pool's threads."""
        future: Future[_T] = Future()
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put(_Job(future, functools.partial(fn, *args, **kwargs)))
            if self._idle == 0 and len(self._daemons) < self._max_workers:
                name = f"{self._thread_name_prefix}_{next(self._started)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                self._daemons.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            with self._guard:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                job = None
            with self._guard:
                self._idle -= 1
                if job is None:
                    # submit() puts a job and counts idle threads under the guard: one that
                    # came in after the timeout counted this thread, so it stays for it.
                    if not self._closed and not self._jobs.empty():
                        continue
                    self._daemons.remove(threading.current_thread())
                    return
            if job.future.set_running_or_notify_cancel():
                try:
                    job.future.set_result(job.call())
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                    job.future.set_exception(exc)
            # An idle thread must not hold its last call: through its context it held a
            # finished job's recorder, engine and model.
            job = None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; never waits (a stuck tool would make it wait forever)."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        job.future.cancel()
            for _ in self._daemons:
                self._jobs.put(None)  # each idle thread ends; stuck ones end with the process


@dataclass(frozen=True)
class _Job:
    future: Future[Any]
    call: Callable[[], Any]


def use_user_code_executor(max_workers: int) -> None:
    """Make a `UserCodeExecutor` of ``max_workers`` threads the running loop's default
    executor (once per loop): where LangChain runs sync tools and ``asyncio.to_thread`` runs."""
    loop = asyncio.get_running_loop()
    if not isinstance(getattr(loop, "_default_executor", None), UserCodeExecutor):
        loop.set_default_executor(UserCodeExecutor(max_workers, thread_name_prefix="agentrl-tool"))
