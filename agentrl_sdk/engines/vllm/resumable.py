"""Pause/resume for engines that can only abort a request: keep its partial output, resubmit later.

Both vLLM backends stream each request's tokens into a `PartialOutput`. `pause` cancels every
attempt in flight (vLLM aborts a request whose stream is dropped); `resume` lets each request
submit again with its prompt plus partial output as the new prompt and the rest of its token
budget. Under greedy sampling the joined output equals an uninterrupted run. A request whose
finish the backend has already recorded (`PartialOutput.finish`) completes instead: a pause can
land between its last tokens and the end of its stream, and a resubmission would sample past its
end (an EOS inside the context).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentrl_sdk.engines.stop_strings import StopStrings
from agentrl_sdk.types import FinishReason, GenerateResult, SamplingParams

__all__ = ["PartialOutput", "ResumableRequests"]

Attempt = Callable[["PartialOutput", int], Awaitable[FinishReason]]
"""Streams one submission of a request into the partial output; returns why it finished, and
records that on the partial output (`PartialOutput.finish`) as soon as it is known."""


@dataclass(eq=False)
class PartialOutput:
    """A request's output so far, token by token, with the policy version of each token."""

    prompt_ids: list[int]
    sampling: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    """Set once the backend reports the request finished, even if its stream has not ended."""
    stop_strings: StopStrings | None = None
    """The request's stop strings: `extend` ends the output at the token completing one."""

    @property
    def context(self) -> list[int]:
        """The prompt of the next submission: the original prompt, then the partial output."""
        return self.prompt_ids + self.token_ids

    @property
    def remaining(self) -> int:
        """Tokens still allowed by ``max_tokens``."""
        return self.sampling.max_tokens - len(self.token_ids)

    def extend(self, ids: list[int], logprobs: list[float], version: int) -> None:
        """Append tokens sampled by policy ``version``.

        A token that completes a stop string is the last one kept: the rest of ``ids`` is
        dropped and the request is finished with ``stop``, so the backend should end its stream.
        """
        checked = len(self.token_ids)
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(ids))
        if self.stop_strings is None or self.finish_reason is not None:
            return
        if (keep := self.stop_strings.first_hit(self.token_ids, checked)) is not None:
            del self.token_ids[keep:], self.logprobs[keep:], self.versions[keep:]
            self.finish("stop")

    def finish(self, reason: FinishReason) -> None:
        """Record that the backend finished the request: a pause no longer resubmits it."""
        self.finish_reason = reason

    def result(self, finish_reason: FinishReason, version: int) -> GenerateResult:
        """The final answer; ``token_versions`` is set only when versions differ."""
        mixed = any(v != version for v in self.versions)
        return GenerateResult(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=finish_reason,
            policy_version=version,
            token_versions=self.versions if mixed else None,
        )


class ResumableRequests:
    """Runs requests as resumable attempts and pauses them all at once; bound to one event loop.

    Args:
        version: Returns the policy version currently serving a request (the engine's
            version, or with named adapters the version of what serves that request).
    """

    def __init__(self, version: Callable[[PartialOutput], int]) -> None:
        self._version = version
        self._running = asyncio.Event()
        self._running.set()
        self._attempts: set[asyncio.Task[FinishReason]] = set()
        self._partials: set[PartialOutput] = set()
        self.resubmissions = 0
        """Attempts cut by a pause and submitted again (a metric)."""

    @property
    def paused(self) -> bool:
        """True between `pause` and `resume`."""
        return not self._running.is_set()

    @property
    def in_flight(self) -> int:
        """Attempts submitted to the backend and not finished."""
        return len(self._attempts)

    def tokens_in_flight(self) -> int:
        """Tokens generated so far by the requests not finished yet (paused ones included)."""
        return sum(len(p.token_ids) for p in self._partials)

    async def run(self, partial: PartialOutput, attempt: Attempt) -> GenerateResult:
        """Submit ``partial`` until it finishes, waiting out pauses; cancellation aborts it."""
        self._partials.add(partial)
        try:
            return await self._run(partial, attempt)
        finally:
            self._partials.discard(partial)

    async def _run(self, partial: PartialOutput, attempt: Attempt) -> GenerateResult:
        number = 0
        while True:
            await self._running.wait()
            if partial.remaining <= 0:  # paused right after its last token
                return partial.result("length", self._version(partial))
            task = asyncio.ensure_future(attempt(partial, number))
            self._attempts.add(task)
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                task.cancel()
                raise
            finally:
                self._attempts.discard(task)
            if not task.cancelled():
                return partial.result(task.result(), self._version(partial))
            if partial.finish_reason is not None:  # paused after its last token: it is done
                return partial.result(partial.finish_reason, self._version(partial))
            number += 1  # cancelled by pause(): go round, the partial output is kept
            self.resubmissions += 1

    async def pause(self) -> None:
        """Abort every attempt in flight, keeping partial output; new attempts wait."""
        self._running.clear()
        attempts = list(self._attempts)
        for task in attempts:
            task.cancel()
        if attempts:
            await asyncio.wait(attempts)

    def resume(self) -> None:
        """Let the held requests submit again."""
        self._running.set()
