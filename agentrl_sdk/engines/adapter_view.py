"""`AdapterView`: one policy's engine when several policies are LoRA adapters of one base."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentrl_sdk.engines.lora_weights import AdapterEngine, AdapterWeights
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    import torch

    from agentrl_sdk.engines.base import Engine

__all__ = ["AdapterView"]


class AdapterView:
    """An `Engine` serving one named adapter (or the bare base) of a shared engine.

    Every request goes to the shared engine with ``SamplingParams.adapter`` set to
    ``adapter``, so requests of all the views share its continuous batch; every adapter push
    is named ``adapter``. The shared base never changes through a view (`update_weights`
    refuses). Pause, resume and health are the shared engine's; `close` closes it (closing is
    idempotent, so each view of it may).

    ``policy_version`` is the version the view's last push returned (the engine's version
    when the view was made, before any): the version the engine stamps on this adapter's
    tokens (see ``TorchEngine``'s versions).

    Args:
        engine: The shared engine; it must take adapters (`AdapterEngine`).
        adapter: The adapter's name; None serves the base alone (a frozen policy).

    Raises:
        ValueError: ``engine`` takes no adapters.
    """

    def __init__(self, engine: Engine, adapter: str | None) -> None:
        if not (isinstance(engine, AdapterEngine) and engine.takes_adapters):
            raise ValueError(
                f"{type(engine).__name__} takes no adapter pushes, so it cannot serve several "
                "policies as adapters of one base (vLLM: set engine_args.enable_lora)"
            )
        self.engine = engine
        self.adapter = adapter
        self._version = engine.policy_version

    @property
    def policy_version(self) -> int:
        """The version of this adapter's weights (see the class docstring)."""
        return self._version

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """The shared engine's ``generate`` with this view's adapter."""
        if sampling.adapter != self.adapter:
            sampling = sampling.model_copy(update={"adapter": self.adapter})
        return await self.engine.generate(
            prompt_ids, sampling, request_id, session_id=session_id
        )

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Refused: the base is shared by every adapter policy and stays frozen."""
        raise EngineError(
            f"policy adapter {self.adapter!r}: the shared base model is frozen; push its "
            "adapter (update_adapter) instead of full weights"
        )

    @property
    def takes_adapters(self) -> bool:
        """Whether the shared engine takes adapter pushes (checked at construction)."""
        return bool(self.engine.takes_adapters)  # type: ignore[attr-defined]

    async def update_adapter(self, adapter: AdapterWeights) -> int:
        """Serve ``adapter`` as this view's adapter; returns (and keeps) the new version.

        Raises:
            EngineError: The view serves the bare base, or the adapter names another one.
        """
        if self.adapter is None or adapter.name != self.adapter:
            raise EngineError(
                f"the view of adapter {self.adapter!r} got a push of adapter {adapter.name!r}"
            )
        self._version = await self.engine.update_adapter(adapter)  # type: ignore[attr-defined]
        return self._version

    async def pause(self) -> None:
        """Pause the shared engine (every view's requests hold)."""
        await self.engine.pause()

    async def resume(self) -> None:
        """Resume the shared engine."""
        await self.engine.resume()

    async def health(self) -> bool:
        """The shared engine's health."""
        return await self.engine.health()

    def close(self) -> None:
        """Close the shared engine."""
        self.engine.close()
