"""`serve` / `aserve`: start an engine over a model folder (or take yours) and serve a graph on
it until interrupted, one MLflow trace per request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.serving.config import ServeConfig
from agentrl_sdk.serving.server import GraphServer

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["aserve", "serve"]


async def aserve(
    graph: Any,
    model: str | Path | Engine,
    *,
    tokenizer: Any = None,
    config: ServeConfig | Mapping[str, Any] | None = None,
    rollout: RolloutConfig | None = None,
    backend: str = "torch",
    engine_options: Mapping[str, Any] | None = None,
    on_ready: Callable[[GraphServer], Any] | None = None,
    **options: Any,
) -> None:
    """Async `serve`, for callers that already run an event loop (runs until cancelled)."""
    settings = ServeConfig.model_validate(
        {**(config.model_dump() if isinstance(config, ServeConfig) else dict(config or {})),
         **options})
    owned = isinstance(model, str | Path)
    if owned:
        from transformers import AutoTokenizer

        from agentrl_sdk.engines import create_engine

        path = str(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, local_files_only=True)
        engine = create_engine(backend, path, **dict(engine_options or {}))
        name = path
    else:
        if tokenizer is None:
            raise TypeError("serving your own engine needs its model's tokenizer: tokenizer=...")
        engine, name = model, None
    try:
        async with GraphServer(graph, engine, tokenizer=tokenizer, config=settings,
                               rollout=rollout, model_name=name) as server:
            if on_ready is not None:
                on_ready(server)
            await asyncio.Event().wait()  # until cancelled (Ctrl-C)
    finally:
        if owned:
            engine.close()


def serve(
    graph: Any,
    model: str | Path | Engine,
    *,
    tokenizer: Any = None,
    config: ServeConfig | Mapping[str, Any] | None = None,
    rollout: RolloutConfig | None = None,
    backend: str = "torch",
    engine_options: Mapping[str, Any] | None = None,
    on_ready: Callable[[GraphServer], Any] | None = None,
    **options: Any,
) -> None:
    """Serve ``graph`` over HTTP until interrupted, one MLflow trace per request.

    ``POST /invoke`` with ``{"input": <graph input>}`` runs the graph once and answers its
    output state and ``trace_id``; every LLM call goes through `sdk.chat_model`, so the trace
    holds the request's token ledger (prompt ids, sampled ids, logprobs, mask, policy
    version, tokenizer identity), which `sdk.traces` reads back as training data. Traces are
    written in the background: a slow or unreachable store never delays a request, and traces
    it does not take are counted (``GET /health``).

    Args:
        graph: A compiled LangGraph graph, or an agent function ``agent(endpoint, input)``
            that sends OpenAI chat completions to ``endpoint.base_url`` (recorded by a
            gateway started with the server).
        model: A local ``save_pretrained`` folder (an engine is started over it and stopped
            at the end), or your engine (then ``tokenizer`` is needed).
        tokenizer: The model's tokenizer; loaded from the folder by default.
        config: A `ServeConfig` or its fields; ``options`` override them (``host``,
            ``port``, ``tracking_uri``, ``experiment``, ``tags``, ``api_key``, ...).
        rollout: Sampling, context budget, timeouts and node rules of every request.
        backend: The engine started over a model folder: ``torch``, ``vllm``,
            ``vllm-server``.
        engine_options: Passed to `create_engine`.
        on_ready: Called with the started `GraphServer` (its ``url``).

    Raises:
        TrackingError: the tracking store cannot be reached at start.
    """
    try:
        asyncio.run(aserve(graph, model, tokenizer=tokenizer, config=config, rollout=rollout,
                           backend=backend, engine_options=engine_options, on_ready=on_ready,
                           **options))
    except KeyboardInterrupt:
        pass
