"""`EnginePool`: many engine replicas behind one `Engine`, with sticky sessions per rollout.

Routing follows verl's AsyncLLMServerManager: a rollout's first call goes to the replica with
the fewest requests in flight, and its later calls to the same replica so the prefix cache
(the conversation so far) is reused. Sessions are kept in an LRU of bounded size.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = ["EnginePool"]

logger = logging.getLogger(__name__)


class EnginePool:
    """Routes requests over ``replicas`` and keeps them on one policy version.

    Routing: a session (the ``session_id`` of `generate`; a request without one is its own
    session) is pinned to a replica. Its first request goes to the healthy replica with the fewest requests
    in flight (ties: the one picked least recently); later requests of the session go to the
    same replica. A request that fails on a replica which then fails its health check drains
    that replica (no new work, its sessions forgotten) and is restarted on another one; the
    rollout repeats only its current call. A request that fails on a healthy replica raises.

    `update_weights` is one operation with a version barrier: every replica is paused, all
    load the weights, all must report the same version, then all resume. A replica that fails
    to load is drained rather than left serving stale weights.

    Args:
        replicas: The engines; any mix of backends (torch, vLLM, Ray actors).
        max_sessions: Most sessions remembered; the least recently used are forgotten.
        health_timeout_s: Longest wait for a replica's health check.
    """

    def __init__(
        self,
        replicas: Sequence[Engine],
        *,
        max_sessions: int = 100_000,
        health_timeout_s: float = 30.0,
    ) -> None:
        if not replicas:
            raise ValueError("EnginePool needs at least one replica")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.replicas = list(replicas)
        self._max_sessions = max_sessions
        self._health_timeout = health_timeout_s
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._in_flight = [0] * len(self.replicas)
        self._last_pick = [0] * len(self.replicas)
        self._picks = 0
        self._drained: set[int] = set()
        # Rollouts under sync invoke call in from several threads' loops.
        self._lock = threading.Lock()
        self._version = max(r.policy_version for r in self.replicas)
        self.reroutes = 0
        self.failed_health_checks = 0

    @property
    def policy_version(self) -> int:
        """The version every healthy replica serves (set by the last `update_weights`)."""
        return self._version

    @property
    def in_flight(self) -> list[int]:
        """Requests in flight on each replica."""
        return list(self._in_flight)

    @property
    def healthy(self) -> list[int]:
        """Indices of the replicas still taking work."""
        return [i for i in range(len(self.replicas)) if i not in self._drained]

    def replica_of(self, session: str) -> int | None:
        """The replica a session is pinned to, if any."""
        return self._sessions.get(session)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """Sample one response on the session's replica, moving it if that replica dies.

        Raises:
            EngineError: Every replica is drained, or the request failed on a healthy replica.
        """
        session = session_id if session_id is not None else request_id
        while True:
            with self._lock:
                index = self._route(session)
                self._in_flight[index] += 1
            try:
                return await self.replicas[index].generate(
                    prompt_ids, sampling, request_id, session_id=session
                )
            except (EngineError, ConnectionError, OSError) as exc:
                if await self._is_healthy(index):
                    raise
                self._drain(index, exc)
                self.reroutes += 1
            finally:
                with self._lock:
                    self._in_flight[index] -= 1

    def _route(self, session: str) -> int:
        index = self._sessions.get(session)
        if index is not None and index not in self._drained:
            self._sessions.move_to_end(session)
            return index
        candidates = self.healthy
        if not candidates:
            raise EngineError(
                f"all {len(self.replicas)} engine replicas are drained (failed health checks); "
                "restart them or the pool"
            )
        index = min(candidates, key=lambda i: (self._in_flight[i], self._last_pick[i]))
        self._picks += 1
        self._last_pick[index] = self._picks
        self._sessions[session] = index
        self._sessions.move_to_end(session)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return index

    async def _is_healthy(self, index: int) -> bool:
        try:
            return bool(
                await asyncio.wait_for(self.replicas[index].health(), self._health_timeout)
            )
        except Exception as exc:  # noqa: BLE001 - a health check that fails is an unhealthy replica
            self.failed_health_checks += 1
            logger.warning("engine replica %d: health check raised %r", index, exc)
            return False

    def _drain(self, index: int, cause: BaseException | str) -> None:
        with self._lock:
            if index in self._drained:
                return
            self._drained.add(index)
            for session in [s for s, i in self._sessions.items() if i == index]:
                del self._sessions[session]
        logger.warning("engine replica %d drained: %s", index, cause)

    def stats(self) -> dict[str, float]:
        """Counts for the step metrics: requests moved off a dead replica, replicas drained,
        health checks that raised (each also logged with its cause)."""
        return {
            "reroutes": float(self.reroutes),
            "drained_replicas": float(len(self._drained)),
            "failed_health_checks": float(self.failed_health_checks),
        }

    async def check_health(self) -> list[int]:
        """Health-check every replica, drain the failing ones; returns the healthy indices."""
        checks = await asyncio.gather(*(self._is_healthy(i) for i in self.healthy))
        for index, ok in zip(self.healthy, checks, strict=True):
            if not ok:
                self._drain(index, "failed its health check")
        return self.healthy

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Load ``state_dict`` into every healthy replica behind a pause, as one version.

        Raises:
            EngineError: No replica took the weights, or they report different versions.
        """
        live = self.healthy
        await self._each(live, "pause")
        try:
            results = await asyncio.gather(
                *(self.replicas[i].update_weights(state_dict) for i in live),
                return_exceptions=True,
            )
            versions = {}
            for index, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    self._drain(index, f"update_weights failed: {result!r}")
                else:
                    versions[index] = result
            if not versions:
                raise EngineError(f"no replica loaded the new weights: {results!r}")
            if len(set(versions.values())) != 1:
                raise EngineError(
                    f"replicas report different policy versions after the update: {versions}; "
                    "they must start from the same version (restart the lagging ones)"
                )
            self._version = next(iter(versions.values()))
            return self._version
        finally:
            await self._each(self.healthy, "resume")

    async def pause(self) -> None:
        """Pause every healthy replica."""
        await self._each(self.healthy, "pause")

    async def resume(self) -> None:
        """Resume every healthy replica."""
        await self._each(self.healthy, "resume")

    async def _each(self, indices: list[int], method: str) -> None:
        results = await asyncio.gather(
            *(getattr(self.replicas[i], method)() for i in indices), return_exceptions=True
        )
        for index, result in zip(indices, results, strict=True):
            if isinstance(result, BaseException):
                self._drain(index, f"{method} failed: {result!r}")

    async def health(self) -> bool:
        """True while at least one replica takes work."""
        return bool(self.healthy)

    def close(self) -> None:
        """Close every replica."""
        for replica in self.replicas:
            try:
                replica.close()
            except Exception as exc:  # noqa: BLE001 - close the others regardless
                logger.warning("closing an engine replica failed: %r", exc)
