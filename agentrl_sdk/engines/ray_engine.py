"""`RayEngine`: any engine built by `create_engine`, living in a Ray actor, behind `Engine`.

The actor is an async actor, so it serves many `generate` calls at once (continuous batching
keeps working); token ids travel as numpy arrays (the object store moves lists ~10x slower).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl_sdk.engines.collective_weights import BucketLayout, WeightGroup, receive_buckets
from agentrl_sdk.engines.lora_weights import AdapterWeights
from agentrl_sdk.engines.ray_weights import RayWeights
from agentrl_sdk.engines.shared_weights import SharedWeights
from agentrl_sdk.engines.tensor_transport import PackedTensors
from agentrl_sdk.errors import EngineError
from agentrl_sdk.threads import RAY_SUBMIT_LOCK
from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = ["RayEngine"]

logger = logging.getLogger(__name__)


class _EngineActor:
    """Runs inside the actor process: builds the engine there and forwards calls to it."""

    def __init__(self, backend: str, model_path: str, options: dict[str, Any]) -> None:
        from agentrl_sdk.engines.factory import create_engine

        self.engine = create_engine(backend, model_path, **options)

    async def generate(self, prompt: np.ndarray, sampling: dict, request_id: str) -> dict:
        result = await self.engine.generate(
            prompt.tolist(), SamplingParams.model_validate(sampling), request_id
        )
        return result.model_dump()

    async def update_weights(self, packed: PackedTensors) -> int:
        return await self.engine.update_weights(packed.unpack())

    def takes_adapters(self) -> bool:
        return bool(getattr(self.engine, "takes_adapters", False))

    async def update_adapter(
        self, packed: PackedTensors, scaling: float, fifo: list[str], name: str | None = None
    ) -> int:
        return await self.engine.update_adapter(
            AdapterWeights(packed.unpack(), scaling, frozenset(fifo), name)
        )

    def shared_weights_host(self) -> str | None:
        return getattr(self.engine, "shared_weights_host", None)

    def takes_collective_weights(self) -> bool:
        return True

    async def join_weight_group(self, group: WeightGroup, rank: int) -> None:
        if getattr(self.engine, "takes_collective_weights", False):
            await self.engine.join_weight_group(group, rank)  # vLLM: its worker joins
        else:
            self._weight_group = (await asyncio.to_thread(group.join, rank), group.device())

    async def update_collective_weights(self, layouts: list[BucketLayout]) -> int:
        if getattr(self.engine, "takes_collective_weights", False):
            return await self.engine.update_collective_weights(layouts)
        group, device = self._weight_group

        def receive() -> dict[str, torch.Tensor]:
            return {k: v for bucket in receive_buckets(group, layouts, device)
                    for k, v in bucket.items()}  # fmt: skip

        return await self.engine.update_weights(await asyncio.to_thread(receive))

    async def update_ray_weights(self, refs: list[Any]) -> int:
        """Fetch the buckets from the trainer's object store (not through the driver)."""
        state: dict[str, torch.Tensor] = {}
        for packed in await asyncio.gather(*refs):
            state.update(packed.unpack())
        return await self.engine.update_weights(state)

    async def update_shared_weights(self, weights: SharedWeights) -> int:
        return await self.engine.update_shared_weights(weights)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def health(self) -> bool:
        return await self.engine.health()

    def where(self) -> tuple[str, int]:
        """The Ray node and the process the engine runs in."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def policy_version(self) -> int:
        return self.engine.policy_version

    def close(self) -> None:
        self.engine.close()


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
            (
                self._version, (self.node_id, self.pid), self._takes_adapters, self._shm_host
            ) = ray.get(
                [self._actor.policy_version.remote(), self._actor.where.remote(),
                 self._actor.takes_adapters.remote(), self._actor.shared_weights_host.remote()],
                timeout=start_timeout_s,
            )  # fmt: skip
        except Exception as exc:
            raise EngineError(f"the {backend!r} engine actor failed to start: {exc}") from exc
        self._closed = False

    @property
    def policy_version(self) -> int:
        """The version last reported by the actor."""
        return self._version

    async def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise EngineError("the RayEngine is closed")
        try:
            with RAY_SUBMIT_LOCK:  # trainer threads submit too (see its docstring)
                ref = getattr(self._actor, method).remote(*args)
            return await asyncio.wait_for(ref, self._timeout)
        except TimeoutError as exc:
            raise EngineError(
                f"the engine actor did not answer {method} in {self._timeout}s"
            ) from exc
        except (ValueError, EngineError):
            raise
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (ValueError, EngineError)):
                raise cause from exc
            raise EngineError(f"the engine actor failed in {method}: {exc}") from exc

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
        result = GenerateResult.model_validate(
            await self._call("generate", prompt, sampling.model_dump(), request_id)
        )
        return result

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Ship ``state_dict`` through the object store (as arrays: no copies) and load it."""
        self._version = await self._call("update_weights", PackedTensors.pack(state_dict))
        return self._version

    @property
    def takes_collective_weights(self) -> bool:
        """Always: the actor (or vLLM's worker in it) joins a push group."""
        return True

    async def join_weight_group(self, group: WeightGroup, rank: int) -> None:
        """The actor's process (or its vLLM worker) joins ``group`` as ``rank``."""
        await self._call("join_weight_group", group, rank)

    async def update_collective_weights(self, layouts: Sequence[BucketLayout]) -> int:
        """The actor receives the broadcast buckets and loads them: no tensor travels here."""
        self._version = await self._call("update_collective_weights", list(layouts))
        return self._version

    @property
    def takes_ray_weights(self) -> bool:
        """Always: the actor fetches pushed buckets from the trainer's object store itself."""
        return True

    async def update_ray_weights(self, weights: RayWeights) -> int:
        """Hand the bucket references to the actor, which fetches them: no tensor travels here."""
        self._version = await self._call("update_ray_weights", list(weights.refs))
        return self._version

    @property
    def shared_weights_host(self) -> str | None:
        """The host whose staged weight files the engine inside reads (None: it cannot)."""
        return self._shm_host

    async def update_shared_weights(self, weights: SharedWeights) -> int:
        """Hand the files' description to the actor, which maps them: no tensor travels."""
        self._version = await self._call("update_shared_weights", weights)
        return self._version

    @property
    def takes_adapters(self) -> bool:
        """Whether the engine inside takes adapter pushes (see `AdapterEngine`)."""
        return self._takes_adapters

    async def update_adapter(self, adapter: AdapterWeights) -> int:
        """Ship the adapter tensors through the object store; the engine inside serves them."""
        packed = PackedTensors.pack(adapter.tensors)
        fifo = sorted(adapter.fan_in_fan_out)
        self._version = await self._call(
            "update_adapter", packed, adapter.scaling, fifo, adapter.name
        )
        return self._version

    async def pause(self) -> None:
        """Pause the engine in the actor."""
        await self._call("pause")

    async def resume(self) -> None:
        """Resume the engine in the actor."""
        await self._call("resume")

    async def health(self) -> bool:
        """False once the actor or its engine is gone."""
        try:
            return bool(await asyncio.wait_for(self._call("health"), 30))
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
