"""`EnginePool`: many engine replicas behind one `Engine`, with sticky sessions per rollout.

Routing follows verl's AsyncLLMServerManager: a rollout's first call goes to the replica with
the fewest requests in flight, and its later calls to the same replica so the prefix cache
(the conversation so far) is reused. Sessions are kept in an LRU of bounded size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from agentrl_sdk.engines.base import Engine, drop_prefix_caches
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import WeightIntake, WeightPush

__all__ = ["EnginePool"]

logger = logging.getLogger(__name__)


HEALTH_TIMEOUT_S = 30.0
"""Default seconds a replica's health check may take before it counts as failed."""

RESTART_TIMEOUT_S = 600.0
"""Default longest wait for one replica rebuild (a vLLM start on a slow machine)."""


class EnginePool:
    """Routes requests over ``replicas`` and keeps them on one policy version.

    Routing: a session (the ``session_id`` of `generate`; a request without one is its own
    session) is pinned to a replica. Its first request goes to the healthy replica with the
    fewest requests in flight (ties: the one picked least recently); later requests of the
    session go to the same replica. A request that fails on a replica which then fails its
    health check drains that replica (no new work, its sessions forgotten) and is restarted on
    another one; the rollout repeats only its current call. A request that fails on a healthy
    replica raises.

    `load_weights` is one operation: every replica is paused, all load the push as the
    driver's version, then all resume. A replica that fails to load is drained rather than
    left serving stale weights. Every replica serves the version it was given, so results
    carry the pool's versions as they are.

    Recovery: given ``restart``, a drained replica is replaced by a new one (at most
    ``max_restarts`` times in all). The new replica serves only once it holds the pool's
    weights: at once if no push happened yet, else from the next `load_weights`, before which
    it takes every named adapter the pool serves, each as the version it was pushed as.

    Args:
        replicas: The engines; any mix of backends (torch, vLLM, Ray actors).
        max_sessions: Most sessions remembered; the least recently used are forgotten.
        health_timeout_s: Longest wait for a replica's health check.
        restart: Builds a new engine for replica ``index`` (blocking; run on a thread).
        max_restarts: Most replicas rebuilt over the pool's life.
        restart_timeout_s: Longest wait for one rebuild.
    """

    def __init__(
        self,
        replicas: Sequence[Engine],
        *,
        max_sessions: int = 100_000,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        restart: Callable[[int], Engine] | None = None,
        max_restarts: int = 3,
        restart_timeout_s: float = RESTART_TIMEOUT_S,
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
        self._pushed = False  # a rebuilt replica serves at once until the first push
        self.reroutes = 0
        self.failed_health_checks = 0
        self._restart = restart
        self._restarts_left = max_restarts if restart is not None else 0
        self._restart_timeout = restart_timeout_s
        # Named adapters served, for rebuilds: each with the version of its last push.
        self._named: dict[str, tuple[AdapterWeights, int]] = {}
        self._awaiting_weights: set[int] = set()  # rebuilt, not yet on the pool's weights
        self._restart_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.restarts = 0
        self.failed_restarts = 0

    @property
    def policy_version(self) -> int:
        """The version every healthy replica serves (set by the last `load_weights`)."""
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
            rebuild = self._restarts_left > 0
            if rebuild:
                self._restarts_left -= 1
        logger.warning("engine replica %d drained: %s", index, cause)
        if rebuild:
            task = asyncio.get_running_loop().create_task(self._rebuild(index))
            self._restart_tasks.add(task)
            task.add_done_callback(self._restart_tasks.discard)

    async def _rebuild(self, index: int) -> None:
        """Replace the drained replica ``index``; it rejoins once it holds the pool's weights."""
        old = self.replicas[index]
        try:  # on a thread of its own: a dead replica's close may hang (not the user's pool)
            await asyncio.wait_for(_on_own_thread(old.close, "engine-close"), _CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a dead replica may not close cleanly
            logger.info("closing dead engine replica %d: %r", index, exc)
        # A thread of its own (not the loop's executor): a pool closed mid-build closes the
        # engine when it arrives instead of leaving it running.
        built = _on_own_thread(lambda: self._build(index), f"engine-restart-{index}")
        try:
            new = await asyncio.wait_for(built, self._restart_timeout)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the pool runs on
            self.failed_restarts += 1
            logger.error("engine replica %d could not be restarted: %r", index, exc)
            return
        self.restarts += 1
        with self._lock:
            if self._closed:
                new.close()
                return
            self.replicas[index] = new
            self._in_flight[index] = 0
            if not self._pushed:  # it holds the pool's weights already: the model folder's
                self._drained.discard(index)
            else:
                self._awaiting_weights.add(index)
        logger.warning("engine replica %d restarted (%s)", index,
                       "serving" if index not in self._drained else "waits for the next weights")

    def _build(self, index: int) -> Engine:
        assert self._restart is not None
        engine = self._restart(index)
        if self._closed:
            engine.close()
            raise EngineError("the pool closed while the replica was rebuilt")
        return engine

    @property
    def restarting(self) -> int:
        """Replicas being rebuilt now."""
        return len(self._restart_tasks)

    def stats(self) -> dict[str, float]:
        """Counts for the step metrics: requests moved off a dead replica, replicas drained,
        health checks that raised (each also logged with its cause)."""
        return {
            "reroutes": float(self.reroutes),
            "drained_replicas": float(len(self._drained)),
            "failed_health_checks": float(self.failed_health_checks),
            "restarts": float(self.restarts),
            "failed_restarts": float(self.failed_restarts),
        }

    async def check_health(self) -> list[int]:
        """Health-check every replica, drain the failing ones; returns the healthy indices."""
        checked = list(self.healthy)  # a rebuilt replica may rejoin while the checks run
        checks = await asyncio.gather(*(self._is_healthy(i) for i in checked))
        for index, ok in zip(checked, checks, strict=True):
            if not ok:
                self._drain(index, "failed its health check")
        return self.healthy

    @property
    def weight_intake(self) -> WeightIntake:
        """What every replica takes, but broadcasts: a pool is one receiver to a push, and its
        replicas cannot all join a push group sized for one."""
        common = WeightIntake.common(replica.weight_intake for replica in self.replicas)
        return dataclasses.replace(common, kinds=common.kinds - {"collective"})

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Load ``push`` into every healthy replica behind a pause, as ``version``.

        Restarted replicas waiting for the pool's weights take them too and rejoin, after
        every other named adapter the pool serves (each as the version it was pushed as);
        when none serves, the load first waits for the rebuilds (up to ``restart_timeout_s``).

        Raises:
            EngineError: No replica took the weights.
        """
        name = push.name if isinstance(push, AdapterWeights) else None
        others = [(a, v) for key, (a, v) in self._named.items() if key != name]

        async def rejoin(replica: Engine) -> None:
            for adapter, adapter_version in others:
                await replica.load_weights(adapter, adapter_version)
            await replica.load_weights(push, version)

        deadline = time.monotonic() + self._restart_timeout
        while not self.healthy and self.restarting and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # nothing serves: the weights must reach the rebuild
        live, rejoining = self.healthy, sorted(self._awaiting_weights)
        await self._each(live, "pause")
        try:
            results = await asyncio.gather(
                *(self.replicas[i].load_weights(push, version) for i in live),
                *(rejoin(self.replicas[i]) for i in rejoining),
                return_exceptions=True,
            )
            loaded = []
            for index, result in zip(live + rejoining, results, strict=True):
                if isinstance(result, BaseException):
                    self._awaiting_weights.discard(index)
                    self._drain(index, f"loading the new {push.kind} failed: {result!r}")
                else:
                    loaded.append(index)
            if not loaded:
                raise EngineError(f"no replica loaded the new {push.kind}: {results!r}")
            self._version, self._pushed = version, True
            if name is not None:
                self._named[name] = (push, version)
            with self._lock:
                for index in set(rejoining) & set(loaded):
                    self._awaiting_weights.discard(index)
                    self._drained.discard(index)
        finally:
            await self._each([i for i in live if i not in self._drained], "resume")

    async def drop_prefix_cache(self) -> None:
        """Empty the prefix caches of the healthy replicas that keep one."""
        await drop_prefix_caches(self.replicas[i] for i in self.healthy)

    async def pause(self) -> None:
        """Pause every healthy replica."""
        await self._each(self.healthy, "pause")

    async def resume(self) -> None:
        """Resume every healthy replica."""
        await self._each(self.healthy, "resume")

    async def _each(self, indices: list[int], method: Literal["pause", "resume"]) -> None:
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
        """Close every replica (and any being rebuilt, once built)."""
        self._closed = True
        for replica in self.replicas:
            try:
                replica.close()
            except Exception as exc:  # noqa: BLE001 - close the others regardless
                logger.warning("closing an engine replica failed: %r", exc)


_CLOSE_TIMEOUT_S = 60.0
"""Longest wait for a dead replica's ``close`` before its rebuild goes on regardless."""


def _on_own_thread(fn: Callable[[], Any], name: str) -> asyncio.Future[Any]:
    """``fn()`` on a daemon thread ``name`` of its own, as an awaitable (abandoned if it never
    ends)."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            done.set_exception(exc)

    threading.Thread(target=run, daemon=True, name=name).start()
    return asyncio.wrap_future(done)
