"""`run_blocking`: the SDK's own blocking calls on a thread pool that user code cannot fill.

LangChain and ``asyncio.to_thread`` run synchronous tools and agent functions on the event
loop's default executor (``cpus + 4`` threads). A tool that never returns keeps its thread
for good, and a few of them used to leave no thread for the trainer update, the weight sync
or a checkpoint, so training stalled behind a stuck tool. The SDK's calls run here instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["run_blocking"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Few blocking SDK calls run at once (one update or push per policy, a checkpoint).
_SDK_THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agentrl-sdk")


async def run_blocking(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``await asyncio.to_thread(fn, ...)``, but on the SDK's own threads (context kept)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_SDK_THREADS, call)
