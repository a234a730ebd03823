"""`RayEngine`: any engine built by `create_engine`, living in a Ray actor, behind `Engine`.

The actor is an async actor, so it serves many `generate` calls at once (continuous batching
keeps working); token ids travel as numpy arrays (the object store moves lists ~10x slower).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from agentrl_sdk.engines.base import ForwardingEngine, drop_prefix_caches
from agentrl_sdk.engines.options import build_engine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.threads import RAY_SUBMIT_LOCK
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights.push import StateDict, WeightIntake, WeightPush

__all__ = ["RayEngine"]

logger = logging.getLogger(__name__)


class _EngineActor(ForwardingEngine):
    """Runs inside the actor process: builds the engine there and forwards calls to it."""

    def __init__(self, backend: str, model_path: str, options: dict[str, Any]) -> None:
        super().__init__(build_engine(backend, model_path, **options))

    async def generate_arrays(self, prompt: np.ndarray, sampling: dict, request_id: str) -> dict:
        """`generate` with its arguments and result as the object store moves them fastest."""
        result = await self.engine.generate(
            prompt.tolist(), SamplingParams.model_validate(sampling), request_id
        )
        return result.model_dump()

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Load ``push`` into the engine; a kind it does not take (object references, a
        broadcast) is turned into tensors here first, off the actor's event loop."""
        if not self.engine.weight_intake.accepts(push):
            push = StateDict(await asyncio.to_thread(push.state_dict), partial=push.partial)
        await self.engine.load_weights(push, version)

    async def drop_prefix_cache(self) -> None:
        await drop_prefix_caches([self.engine])

    def started(self) -> tuple[int, tuple[str, int], WeightIntake]:
        """The engine's version, the Ray node and process it runs in, and its intake."""
        import ray

        where = (ray.get_runtime_context().get_node_id(), os.getpid())
        return self.engine.policy_version, where, self.engine.weight_intake


class RayEngine:
    """An engine in a Ray actor (Ray must be initialised); same contract as the engine inside.

    Args:
        backend: A `create_engine` backend name (``torch``, ``vllm``, ``vllm-server``).
        model_path: A local model folder, readable from the actor's node.
        actor_options: ``.options(...)`` of the actor (``num_cpus``, ``num_gpus``, ...).
        start_timeout_s: Longest wait for the actor to build its engine.
        call_timeout_s: Longest wait for one call (a whole generation included).
        **options: The backend's options.

    Attributes:
        node_id: The Ray node the actor runs on.
        pid: The actor's process id.
    """

    def __init__(
        self,
        backend: str,
        model_path: str,
        *,
        actor_options: Mapping[str, Any] | None = None,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 600.0,
        **options: Any,
    ) -> None:
        import ray

        if not ray.is_initialized():
            raise EngineError(
                "RayEngine needs a running Ray: call ray.init() (or start the TrainerGroup) first"
            )
        actor = ray.remote(_EngineActor).options(
            max_concurrency=1000, **{"num_cpus": 0, **(actor_options or {})}
        )
        self._actor = actor.remote(backend, model_path, options)
        self._timeout = call_timeout_s
        try:
            started = ray.get(self._actor.started.remote(), timeout=start_timeout_s)
            self._version, (self.node_id, self.pid), inner = started
        except Exception as exc:
            raise EngineError(f"the {backend!r} engine actor failed to start: {exc}") from exc
        # The actor turns object references and broadcasts into tensors for the engine inside.
        self.weight_intake = dataclasses.replace(
            inner, kinds=inner.kinds | {"state_dict", "object_refs", "collective"}
        )
        self._closed = False

    @property
    def policy_version(self) -> int:
        """The version last reported by the actor."""
        return self._version

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        """``method`` of the `_EngineActor` (named by the function: a rename is a type error
        here), within the call timeout; its errors as `EngineError` (or the `ValueError`)."""
        if self._closed:
            raise EngineError("the RayEngine is closed")
        name = method.__name__
        try:
            with RAY_SUBMIT_LOCK:  # trainer threads submit too (see its docstring)
                ref = getattr(self._actor, name).remote(*args)
            return await asyncio.wait_for(ref, self._timeout)
        except TimeoutError as exc:
            raise EngineError(
                f"the engine actor did not answer {name} in {self._timeout}s"
            ) from exc
        except (ValueError, EngineError):
            raise
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (ValueError, EngineError)):
                raise cause from exc
            raise EngineError(f"the engine actor failed in {name}: {exc}") from exc

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,  # one engine: no replica to pin to
    ) -> GenerateResult:
        """Sample one response in the actor."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        sampled = sampling.model_dump()
        reply = await self._call(_EngineActor.generate_arrays, prompt, sampled, request_id)
        return GenerateResult.model_validate(reply)

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Hand ``push`` to the actor, which loads it: tensors travel as numpy arrays through
        the object store; staged files, object references and broadcasts as their
        descriptions (the actor maps, fetches or receives the tensors itself)."""
        await self._call(_EngineActor.load_weights, push, version)
        self._version = version

    async def drop_prefix_cache(self) -> None:
        """Empty the prefix cache of the engine in the actor, if it keeps one."""
        await self._call(_EngineActor.drop_prefix_cache)

    async def pause(self) -> None:
        """Pause the engine in the actor."""
        await self._call(_EngineActor.pause)

    async def resume(self) -> None:
        """Resume the engine in the actor."""
        await self._call(_EngineActor.resume)

    async def health(self) -> bool:
        """False once the actor or its engine is gone."""
        try:
            return bool(await asyncio.wait_for(self._call(_EngineActor.health), 30))
        except Exception as exc:  # noqa: BLE001 - a dead actor is the unhealthy answer
            logger.warning("engine actor health check failed: %r", exc)
            return False

    def close(self) -> None:
        """Close the engine and end the actor."""
        if self._closed:
            return
        self._closed = True
        import ray

        try:
            ray.get(self._actor.close.remote(), timeout=60)
        except Exception as exc:  # noqa: BLE001 - the actor is killed below either way
            logger.warning("engine actor did not close cleanly (killing it): %r", exc)
        ray.kill(self._actor)
