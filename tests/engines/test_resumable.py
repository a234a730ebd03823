"""ResumableRequests: a paused attempt keeps its partial output and goes on from it on resume."""

from __future__ import annotations

import asyncio

from agentrl_sdk.engines.vllm.resumable import PartialOutput, ResumableRequests
from agentrl_sdk.types import SamplingParams


class CountingBackend:
    """Emits token = position in the whole sequence, one per 5 ms, from the context it gets."""

    def __init__(self) -> None:
        self.version = 0
        self.contexts: list[list[int]] = []

    async def attempt(self, partial: PartialOutput, number: int):
        self.contexts.append(partial.context)
        while partial.remaining > 0:
            await asyncio.sleep(0.005)
            partial.extend([len(partial.context)], [-0.5], self.version)
        return "length"


async def test_pause_keeps_partial_output_and_resume_continues_it() -> None:
    backend = CountingBackend()
    requests = ResumableRequests(lambda _: backend.version)
    partial = PartialOutput([100, 101], SamplingParams(max_tokens=40))
    running = asyncio.ensure_future(requests.run(partial, backend.attempt))
    while len(partial.token_ids) < 5:
        await asyncio.sleep(0.001)
    await requests.pause()
    held = len(partial.token_ids)
    assert requests.paused and requests.in_flight == 0
    await asyncio.sleep(0.05)
    assert len(partial.token_ids) == held and not running.done()
    backend.version = 1
    requests.resume()
    result = await asyncio.wait_for(running, 5)
    assert result.token_ids == list(range(2, 42))  # one sequence, as if never interrupted
    assert result.token_versions == [0] * held + [1] * (40 - held)
    assert result.policy_version == 1
    assert backend.contexts == [[100, 101], [100, 101, *range(2, 2 + held)]]
    assert requests.resubmissions == 1


async def test_cancelling_the_caller_while_paused_drops_the_request() -> None:
    backend = CountingBackend()
    requests = ResumableRequests(lambda _: backend.version)
    await requests.pause()
    waiting = asyncio.ensure_future(
        requests.run(PartialOutput([1], SamplingParams(max_tokens=3)), backend.attempt)
    )
    await asyncio.sleep(0.02)
    assert backend.contexts == []  # nothing is submitted while paused
    waiting.cancel()
    requests.resume()
    await asyncio.sleep(0.02)
    assert waiting.cancelled() and backend.contexts == [] and requests.tokens_in_flight() == 0


async def test_a_pause_after_the_finish_is_known_completes_the_request() -> None:
    """The backend saw the last token and its finish; the stream's end is still to come."""
    submitted: list[list[int]] = []

    async def attempt(partial: PartialOutput, number: int):
        submitted.append(partial.context)
        partial.extend([7, 2], [-0.1, -0.2], 0)
        partial.finish("stop")
        await asyncio.sleep(10)  # the end of the stream, never reached: the pause cuts it
        return "stop"

    requests = ResumableRequests(lambda _: 0)
    partial = PartialOutput([1], SamplingParams(max_tokens=40))
    running = asyncio.ensure_future(requests.run(partial, attempt))
    while not partial.token_ids:
        await asyncio.sleep(0.001)
    await requests.pause()
    result = await asyncio.wait_for(running, 1)  # done while paused, not held for resume
    assert (result.token_ids, result.finish_reason) == ([7, 2], "stop")
    assert submitted == [[1]] and requests.resubmissions == 0
