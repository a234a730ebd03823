"""Pause a vLLM-backed engine while a request is midway, however fast this machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentrl_sdk.types import GenerateResult


async def started(engine, running: asyncio.Future, tokens: int = 20) -> None:
    """Wait until the engine's unfinished requests have generated ``tokens``."""
    for _ in range(2000):
        if engine._requests.tokens_in_flight() >= tokens or running.done():
            return
        await asyncio.sleep(0.005)


async def pause_midway(
    engine, start: Callable[[], Awaitable[GenerateResult]], full_length: int, attempts: int = 5
) -> tuple[asyncio.Future, int]:
    """Start a request, then pause ``engine`` while the request holds a partial output.

    A loaded machine can deliver the pause after the request's last token; such an attempt
    tests nothing, so it is let finish and started again.

    Returns:
        The running request (the engine is paused) and the engine's resubmission count
        before this attempt.
    """
    for _ in range(attempts):
        resubmitted = engine._requests.resubmissions
        running = asyncio.ensure_future(start())
        await started(engine, running)
        await engine.pause()
        if 0 < engine._requests.tokens_in_flight() < full_length:
            return running, resubmitted
        await engine.resume()
        await asyncio.wait_for(running, 120)
    pytest.fail(f"the pause never caught the request midway in {attempts} attempts")
