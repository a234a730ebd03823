"""The `Engine` protocol: token ids in, token ids + logprobs + policy version out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    from agentrl_sdk.weights.push import WeightIntake, WeightPush

__all__ = ["CachesPrefixes", "Engine", "ForwardingEngine", "drop_prefix_caches"]

logger = logging.getLogger(__name__)


@runtime_checkable
class Engine(Protocol):
    """An inference backend. It never sees text, only token ids.

    Implementations: `TorchEngine` (embedded, CPU default), `VLLMEngine` (in-process vLLM),
    `VLLMServerEngine` (vLLM's OpenAI-compatible server), `RayEngine` (any of them in a Ray
    actor) and `EnginePool` (several replicas behind one engine).

    Pause/resume contract: `pause` stops decoding and holds every request in flight with its
    partial ids, logprobs and versions; `generate` calls made while paused wait; weights may
    be updated while paused; `resume` continues the held requests on the current weights,
    their partial output becoming part of the prompt. The result's ``token_versions`` then
    says which policy version sampled each token.

    Weights: `load_weights` takes one `WeightPush` of a kind the engine lists in its
    `weight_intake`, and the version the driver assigned to it (the trainer updates those
    weights have seen); from then on the engine reports that version.
    """

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served: the one the last `load_weights` gave."""
        ...

    @property
    def weight_intake(self) -> WeightIntake:
        """The push kinds `load_weights` takes (data: callers choose a kind from it)."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """Sample one response to ``prompt_ids``.

        ``session_id`` names the conversation (rollout) the request belongs to: a pool keeps
        a session's requests on one replica, where its prefix is cached. Engines serving
        alone ignore it.
        """
        ...

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Serve the weights of ``push`` from the next decoding step on, as ``version``.

        Raises:
            EngineError: The weights did not load (the engine serves the old ones).
        """
        ...

    async def pause(self) -> None:
        """Stop decoding; requests in flight keep their partial output until `resume`."""
        ...

    async def resume(self) -> None:
        """Continue the requests held by `pause`."""
        ...

    async def health(self) -> bool:
        """True while the engine can serve requests."""
        ...

    def close(self) -> None:
        """Release the engine (threads, processes); later requests fail with `EngineError`."""
        ...


class ForwardingEngine:
    """An `Engine` that hands each member of the protocol to ``engine``: a wrapper subclasses it
    and overrides only what it changes (`WeightGate` holds requests, `AdapterView` names its
    adapter). Optional controls (`CachesPrefixes`) are not forwarded: a wrapper that
    passes them on says so itself.

    Args:
        engine: The wrapped engine.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def policy_version(self) -> int:
        """The wrapped engine's."""
        return self.engine.policy_version

    @property
    def weight_intake(self) -> WeightIntake:
        """The wrapped engine's."""
        return self.engine.weight_intake

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """The wrapped engine's, once `_admit` lets the request through."""
        sampling = await self._admit(sampling)
        return await self.engine.generate(prompt_ids, sampling, request_id, session_id=session_id)

    async def _admit(self, sampling: SamplingParams) -> SamplingParams:
        """Waits until a request may go to the wrapped engine; the sampling it goes with (the
        one hook a wrapper needs on requests: `WeightGate` waits, `AdapterView` names its
        adapter)."""
        return sampling

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """The wrapped engine's."""
        await self.engine.load_weights(push, version)

    async def pause(self) -> None:
        """The wrapped engine's."""
        await self.engine.pause()

    async def resume(self) -> None:
        """The wrapped engine's."""
        await self.engine.resume()

    async def health(self) -> bool:
        """The wrapped engine's."""
        return await self.engine.health()

    def close(self) -> None:
        """Close the wrapped engine."""
        self.engine.close()


@runtime_checkable
class CachesPrefixes(Protocol):
    """An engine that keeps the keys and values of finished requests in memory of its own, for
    later prompts that start the same way (`TorchEngine`'s ``prefix_cache_mb``; the pool and
    the Ray actor forward to theirs). Optional: engines without it are left alone."""

    async def drop_prefix_cache(self) -> None:
        """Forget every cached prefix now (loading weights does so too)."""
        ...


async def drop_prefix_caches(engines: Iterable[object]) -> None:
    """Empty the prefix caches of those ``engines`` that keep one in memory.

    The loop calls it when no request will run on the served weights again before the next
    push (on-policy, before an update): the cache is dead then, and its memory would only
    add to the update's. A cache that cannot be dropped is logged, never fatal: it is only
    memory, and the push clears it anyway.
    """
    caching = [e for e in engines if isinstance(e, CachesPrefixes)]
    results = await asyncio.gather(*(e.drop_prefix_cache() for e in caching),
                                   return_exceptions=True)  # fmt: skip
    for engine, result in zip(caching, results, strict=True):
        if isinstance(result, BaseException):
            logger.warning("%s kept its prefix cache: %r", type(engine).__name__, result)
