"""`create_engine`: the one place an engine backend is chosen by name."""

from __future__ import annotations

from typing import Any

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.engines.options import backend_named, build_engine


def create_engine(
    backend: str,
    model_path: str,
    *,
    replicas: int = 1,
    ray_actors: bool = False,
    max_restarts: int = 0,
    health_timeout_s: float | None = None,
    restart_timeout_s: float | None = None,
    **options: Any,
) -> Engine:
    """Start the ``backend`` engine over the local model folder ``model_path``.

    Args:
        backend: ``torch`` (embedded, CPU default), ``vllm`` (in-process vLLM `AsyncLLM`) or
            ``vllm-server`` (vLLM's OpenAI-compatible server; ``url=`` uses a running one).
        model_path: A local ``save_pretrained`` folder.
        replicas: More than one builds an `EnginePool` of that many engines.
        ray_actors: Run each engine in its own Ray actor (`RayEngine`); Ray must be started.
        max_restarts: Replicas rebuilt when they die (see `EnginePool`); engines in Ray
            actors then sit behind a pool even alone, so a killed actor is replaced.
        health_timeout_s: A pool's health-check timeout (None: `EnginePool`'s default).
        restart_timeout_s: A pool's longest wait for one rebuild (None: its default).
        **options: Backend options: ``max_batch_size`` for all; ``dtype`` (also
            'prefer-bfloat16': see `agentrl_sdk.hardware`),
            ``max_model_len``, ``engine_args`` for ``vllm``; ``url``, ``server_args`` for
            ``vllm-server``.
    """
    backend_named(backend)  # an unknown name fails before any pool or actor is built
    # 'prefer-bfloat16' is resolved where each engine is built (`build_engine`): in a Ray
    # actor, by the CPU of the node it runs on.
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if replicas > 1 or (ray_actors and max_restarts > 0):
        timeouts = {"health_timeout_s": health_timeout_s, "restart_timeout_s": restart_timeout_s}
        return _pool(backend, model_path, replicas, ray_actors, max_restarts, options,
                     {k: v for k, v in timeouts.items() if v is not None})
    if ray_actors:
        from agentrl_sdk.engines.ray import RayEngine

        return RayEngine(backend, model_path, **options)
    return build_engine(backend, model_path, **options)


def _pool(
    backend: str, model_path: str, replicas: int, ray_actors: bool, max_restarts: int,
    options: dict[str, Any], timeouts: dict[str, float],
) -> Engine:
    """``replicas`` engines behind an `EnginePool` that rebuilds dead ones the same way."""
    from agentrl_sdk.engines.pool import EnginePool

    def build(index: int = 0) -> Engine:
        return create_engine(backend, model_path, ray_actors=ray_actors, **options)

    engines: list[Engine] = []
    try:
        for _ in range(replicas):
            engines.append(build())
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    return EnginePool(engines, restart=build, max_restarts=max_restarts, **timeouts)
