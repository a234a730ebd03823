"""Serve a local model folder through the recording gateway until interrupted (``agentrl gateway``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.gateway.config import GatewayConfig
from agentrl_sdk.gateway.server import Gateway


async def serve_model(
    model_path: str,
    *,
    backend: str = "torch",
    config: GatewayConfig | None = None,
    rollout: RolloutConfig | None = None,
    on_ready: Callable[[Gateway], Any] | None = None,
    engine_options: dict[str, Any] | None = None,
    on_client_close: Callable[[Any], Any] | None = None,
) -> None:
    """Start the ``backend`` engine over ``model_path`` behind a gateway and serve forever.

    Args:
        model_path: A local ``save_pretrained`` folder (model and tokenizer).
        backend: An engine backend `create_engine` knows (``torch``, ``vllm``, ``vllm-server``).
        on_ready: Called with the started gateway (to print its URL and key).
        on_client_close: Called with each rollout's trajectory as its client closes it
            (see `Gateway`).
    """
    from transformers import AutoTokenizer

    from agentrl_sdk.engines import create_engine

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    engine = create_engine(backend, model_path, **(engine_options or {}))
    try:
        async with Gateway(engine, tokenizer, config=config, rollout=rollout,
                           on_client_close=on_client_close) as gateway:
            if on_ready is not None:
                on_ready(gateway)
            await asyncio.Event().wait()  # until cancelled (Ctrl-C)
    finally:
        engine.close()
