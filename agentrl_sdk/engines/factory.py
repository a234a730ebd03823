"""`create_engine`: the one place an engine backend is chosen by name."""

from __future__ import annotations

from typing import Any

from agentrl_sdk.engines.base import Engine


def create_engine(backend: str, model_path: str, **options: Any) -> Engine:
    """Start the ``backend`` engine over the local model folder ``model_path``.

    Args:
        backend: ``torch`` (embedded, CPU default).
        model_path: A local ``save_pretrained`` folder.
        **options: Backend options (``max_batch_size`` for ``torch``).
    """
    if backend == "torch":
        from agentrl_sdk.engines.torch_engine import TorchEngine

        return TorchEngine.from_pretrained(model_path, **options)
    raise ValueError(f"unknown engine backend {backend!r}; available: 'torch'")
