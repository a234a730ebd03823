"""`AdapterView`: one policy's engine when several policies are LoRA adapters of one base."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl_sdk.engines.base import ForwardingEngine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import WeightIntake, WeightPush

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["AdapterView"]


class AdapterView(ForwardingEngine):
    """An `Engine` serving one named adapter (or the bare base) of a shared engine.

    Every request goes to the shared engine with ``SamplingParams.adapter`` set to
    ``adapter``, so requests of all the views share its continuous batch; every adapter push
    is named ``adapter``. The shared base never changes through a view (`load_weights` takes
    this view's adapter only). Pause, resume and health are the shared engine's; `close`
    closes it (closing is idempotent, so each view of it may).

    ``policy_version`` is the version of the view's last push (the engine's version when the
    view was made, before any): the version the engine stamps on this adapter's tokens.

    Args:
        engine: The shared engine; it must take adapters (its `WeightIntake`).
        adapter: The adapter's name; None serves the base alone (a frozen policy).

    Raises:
        ValueError: ``engine`` takes no adapters.
    """

    def __init__(self, engine: Engine, adapter: str | None) -> None:
        if not engine.weight_intake.takes("adapter"):
            raise ValueError(
                f"{type(engine).__name__} takes no adapter pushes, so it cannot serve several "
                "policies as adapters of one base (vLLM: set engine_args.enable_lora)"
            )
        super().__init__(engine)
        self.adapter = adapter
        self._version = engine.policy_version

    @property
    def policy_version(self) -> int:
        """The version of this adapter's weights (see the class docstring)."""
        return self._version

    async def _admit(self, sampling: SamplingParams) -> SamplingParams:
        """The request with this view's adapter."""
        if sampling.adapter == self.adapter:
            return sampling
        return sampling.model_copy(update={"adapter": self.adapter})

    @property
    def weight_intake(self) -> WeightIntake:
        """Adapters only: the shared base stays frozen."""
        return WeightIntake(frozenset({"adapter"}))

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Serve ``push`` as this view's adapter from now on, as ``version``.

        Raises:
            EngineError: The push is not this view's adapter (full weights would change the
                base every adapter policy shares; the bare base takes no adapter).
        """
        if not isinstance(push, AdapterWeights) or self.adapter is None or (
            push.name != self.adapter
        ):
            what = f"adapter {push.name!r}" if isinstance(push, AdapterWeights) else push.kind
            raise EngineError(
                f"the view of adapter {self.adapter!r} got a push of {what}: the shared base "
                "model is frozen, each view takes its own named adapter"
            )
        await self.engine.load_weights(push, version)
        self._version = version
