"""`EnginePool`: many engine replicas behind one `Engine`, with sticky sessions per rollout.

Routing follows verl's AsyncLLMServerManager: a rollout's first call goes to the replica with
the fewest requests in flight, and its later calls to the same replica so the prefix cache
(the conversation so far) is reused. Sessions are kept in an LRU of bounded size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    import torch

    from agentrl_sdk.engines.lora_weights import AdapterWeights
    from agentrl_sdk.engines.ray_weights import RayWeights
    from agentrl_sdk.engines.shared_weights import SharedWeights

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

    Recovery: given ``restart``, a drained replica is replaced by a new one (at most
    ``max_restarts`` times in all). The new replica serves only once it holds the pool's
    weights: at once if no update happened yet, else from the next `update_weights`. Its own
    version count restarts, so the pool maps it onto the pool's (results carry the pool's
    versions).

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
        health_timeout_s: float = 30.0,
        restart: Callable[[int], Engine] | None = None,
        max_restarts: int = 3,
        restart_timeout_s: float = 600.0,
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
        self._restart = restart
        self._restarts_left = max_restarts if restart is not None else 0
        self._restart_timeout = restart_timeout_s
        self._versions = [_ReplicaVersions() for _ in self.replicas]
        # Named adapters served, for rebuilds: each with the pool version of its last push.
        self._named: dict[str, tuple[AdapterWeights, int]] = {}
        self._awaiting_weights: set[int] = set()  # rebuilt, not yet on the pool's weights
        self._restart_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.restarts = 0
        self.failed_restarts = 0

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
                result = await self.replicas[index].generate(
                    prompt_ids, sampling, request_id, session_id=session
                )
                return self._versions[index].shifted(result)
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
            await asyncio.wait_for(_on_own_thread(old.close), _CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a dead replica may not close cleanly
            logger.info("closing dead engine replica %d: %r", index, exc)
        built: concurrent.futures.Future[Engine] = concurrent.futures.Future()
        # A thread of its own (not the loop's executor): a pool closed mid-build closes the
        # engine when it arrives instead of leaving it running.
        threading.Thread(target=self._build, args=(index, built), daemon=True,
                         name=f"engine-restart-{index}").start()
        try:
            new = await asyncio.wait_for(asyncio.wrap_future(built), self._restart_timeout)
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
            if new.policy_version == self._version:  # no update yet: it already holds them
                self._versions[index] = _ReplicaVersions()
                self._drained.discard(index)
            else:
                self._awaiting_weights.add(index)
        logger.warning("engine replica %d restarted (%s)", index,
                       "serving" if index not in self._drained else "waits for the next weights")

    def _build(self, index: int, built: concurrent.futures.Future[Engine]) -> None:
        assert self._restart is not None
        try:
            engine = self._restart(index)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting rebuild
            built.set_exception(exc)
            return
        if self._closed:
            engine.close()
            built.set_exception(EngineError("the pool closed while the replica was rebuilt"))
        else:
            built.set_result(engine)

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
        checks = await asyncio.gather(*(self._is_healthy(i) for i in self.healthy))
        for index, ok in zip(self.healthy, checks, strict=True):
            if not ok:
                self._drain(index, "failed its health check")
        return self.healthy

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Load ``state_dict`` into every healthy replica behind a pause, as one version.

        Restarted replicas waiting for the pool's weights take them too and rejoin; when
        none serves, the update first waits for the rebuilds (up to ``restart_timeout_s``).

        Raises:
            EngineError: No replica took the weights, or they report different versions.
        """
        return await self._update(lambda replica: replica.update_weights(state_dict), "weights")

    @property
    def takes_ray_weights(self) -> bool:
        """Whether every replica fetches pushed object references itself (Ray actors)."""
        return all(getattr(replica, "takes_ray_weights", False) for replica in self.replicas)

    async def update_ray_weights(self, weights: RayWeights) -> int:
        """`update_weights` from the trainer's object store: each replica fetches the buckets."""
        return await self._update(lambda replica: replica.update_ray_weights(weights), "weights")

    @property
    def shared_weights_host(self) -> str | None:
        """The host every replica maps staged weight files from (None: they differ or cannot)."""
        hosts = {
            getattr(replica, "shared_weights_host", None) for replica in self.replicas
        }
        return hosts.pop() if len(hosts) == 1 else None

    async def update_shared_weights(self, weights: SharedWeights) -> int:
        """`update_weights` from staged files: each replica maps them itself."""
        return await self._update(
            lambda replica: replica.update_shared_weights(weights), "weights"
        )

    @property
    def takes_adapters(self) -> bool:
        """Whether every replica takes adapter pushes (see `AdapterEngine`)."""
        return all(getattr(replica, "takes_adapters", False) for replica in self.replicas)

    async def update_adapter(self, adapter: AdapterWeights) -> int:
        """`update_weights` for an adapter push: every replica serves its base + ``adapter``
        (a rebuilt replica's base is the model folder), as one version.

        A named adapter is one of several served side by side: a rebuilt replica rejoining
        on this push first takes every other named adapter the pool serves, and reports for
        each (and for the base) the pool's version of it, as the other replicas do.
        """
        others = [(a, v) for name, (a, v) in self._named.items() if name != adapter.name]

        async def rejoin(replica: Any) -> tuple[int, dict[int, int]]:
            pinned = {0: 0}  # its base: the model folder, as the pool's (adapters push no base)
            for other, version in others:
                pinned[await replica.update_adapter(other)] = version
            return await replica.update_adapter(adapter), pinned

        version = await self._update(
            lambda replica: replica.update_adapter(adapter), "adapter", rejoin=rejoin
        )
        if adapter.name is not None:
            self._named[adapter.name] = (adapter, version)
        return version

    async def _update(
        self,
        load: Callable[[Any], Awaitable[int]],
        what: str,
        rejoin: Callable[[Any], Awaitable[tuple[int, dict[int, int]]]] | None = None,
    ) -> int:
        """Load into every healthy replica behind a pause (``load``), and into each rebuilt one
        waiting for weights (``rejoin``, which also gives the pool version of each own version
        it loaded before its last; ``load`` alone without one); the pool's new version."""

        async def loaded_alone(replica: Any) -> tuple[int, dict[int, int]]:
            return await load(replica), {}

        rejoin = rejoin or loaded_alone
        deadline = time.monotonic() + self._restart_timeout
        while not self.healthy and self.restarting and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # nothing serves: the weights must reach the rebuild
        live, rejoining = self.healthy, sorted(self._awaiting_weights)
        await self._each(live, "pause")
        try:
            targets = live + rejoining
            results = await asyncio.gather(
                *((rejoin if i in self._awaiting_weights else load)(self.replicas[i])
                  for i in targets),
                return_exceptions=True,
            )
            versions: dict[int, int] = {}
            rejoined: dict[int, tuple[int, dict[int, int]]] = {}
            for index, result in zip(targets, results, strict=True):
                if isinstance(result, BaseException):
                    self._awaiting_weights.discard(index)
                    self._drain(index, f"loading the new {what} failed: {result!r}")
                elif index in self._awaiting_weights:
                    rejoined[index] = result
                else:
                    versions[index] = self._versions[index].to_pool(result)
            if not versions and not rejoined:
                raise EngineError(f"no replica loaded the new {what}: {results!r}")
            if len(set(versions.values())) > 1:
                raise EngineError(
                    f"replicas report different policy versions after the update: {versions}; "
                    "they must start from the same version (restart the lagging ones)"
                )
            self._version = next(iter(versions.values()), self._version + 1)
            with self._lock:
                for index, (own, pinned) in rejoined.items():
                    self._versions[index] = _ReplicaVersions(self._version - own, pinned)
                    self._awaiting_weights.discard(index)
                    self._drained.discard(index)
            return self._version
        finally:
            await self._each([i for i in live if i not in self._drained], "resume")

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
        """Close every replica (and any being rebuilt, once built)."""
        self._closed = True
        for replica in self.replicas:
            try:
                replica.close()
            except Exception as exc:  # noqa: BLE001 - close the others regardless
                logger.warning("closing an engine replica failed: %r", exc)


_CLOSE_TIMEOUT_S = 60.0
"""Longest wait for a dead replica's ``close`` before its rebuild goes on regardless."""


def _on_own_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """``fn()`` on a daemon thread of its own, as an awaitable (abandoned if it never ends)."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            done.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="engine-close").start()
    return asyncio.wrap_future(done)


@dataclass
class _ReplicaVersions:
    """How a replica's own version counter maps onto the pool's: a rebuilt replica counts from
    0 again, and takes on rejoining, one version each, adapters the others got long before."""

    offset: int = 0
    """Pool version - own version, for every version it loaded as one of the pool's pushes."""
    pinned: dict[int, int] = field(default_factory=dict)
    """The pool version of each own version it loaded on rejoining, before that push."""

    def to_pool(self, own: int) -> int:
        return self.pinned.get(own, own + self.offset)

    def shifted(self, result: GenerateResult) -> GenerateResult:
        """``result`` with its versions on the pool's count."""
        if not self.offset and not self.pinned:
            return result
        tokens = result.token_versions
        return result.model_copy(update={
            "policy_version": self.to_pool(result.policy_version),
            "token_versions": None if tokens is None else [self.to_pool(v) for v in tokens],
        })  # fmt: skip
