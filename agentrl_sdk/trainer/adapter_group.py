"""`AdapterGroup`: one policy's trainer when several policies are LoRA adapters of one base."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl_sdk.trainer.group import TrainerError, TrainerGroup
from agentrl_sdk.types import Batch
from agentrl_sdk.weights.push import WeightIntake, WeightKind, WeightPush

if TYPE_CHECKING:
    import torch

__all__ = ["AdapterExports", "AdapterGroup"]


class AdapterGroup:
    """The part of a shared `TrainerGroup` that trains LoRA adapter ``adapter``.

    The group holds the base once and one PEFT adapter per adapter policy; each view updates,
    checkpoints, exports and pushes its own adapter with its own optimizer (the group's calls
    with ``adapter=``). Calls of all views of one group are serialised on the group's lock,
    so every rank sees them in one order. Pushes always carry the named adapter (the engine
    serves it beside the others, see `AdapterView`); never merged weights.

    Args:
        group: The shared group; ``adapter`` must be one of ``group.adapters``.
        adapter: The adapter (the policy's name).

    Raises:
        ValueError: The group holds no such adapter.
    """

    def __init__(self, group: TrainerGroup, adapter: str) -> None:
        if adapter not in group.adapters:
            raise ValueError(f"the trainer group holds adapters {list(group.adapters)}, "
                             f"not {adapter!r}")  # fmt: skip
        self.group = group
        self.adapter = adapter
        self.weights = AdapterExports(group, adapter)
        """This adapter's weights as pushes (`AdapterExports`)."""

    def update(self, batch: Batch) -> dict[str, float]:
        """One update of this adapter on ``batch`` (see `TrainerGroup.update`)."""
        with self.group.lock:
            return self.group.update(batch, adapter=self.adapter)

    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        """Logprobs of ``batch``'s response tokens under base + this adapter."""
        with self.group.lock:
            return self.group.compute_logprobs(batch, adapter=self.adapter)

    def save_checkpoint(
        self, path: str | os.PathLike[str], extra: dict[str, Any] | None = None
    ) -> None:
        """Saves this adapter, its optimizer, schedule and counters (not the base)."""
        with self.group.lock:
            self.group.save_checkpoint(path, extra, adapter=self.adapter)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restores this adapter's checkpoint; returns its ``extra``."""
        with self.group.lock:
            return self.group.load_checkpoint(path, adapter=self.adapter)

    def export_pretrained(
        self,
        path: str | os.PathLike[str],
        form: Literal["merged", "adapter"] | None = None,
    ) -> Path:
        """Writes base + this adapter, merged or as a PEFT adapter folder (``lora.export``)."""
        with self.group.lock:
            return self.group.export_pretrained(path, form, adapter=self.adapter)

    def shutdown(self) -> None:
        """Shut the shared group down (idempotent: every view of it may)."""
        with self.group.lock:
            self.group.shutdown()


class AdapterExports:
    """One adapter of a shared group as pushes (a `WeightSource`): always the named adapter,
    never merged weights; the shared base never moves."""

    weight_offer = WeightIntake(frozenset({"adapter"}))

    def __init__(self, group: TrainerGroup, adapter: str) -> None:
        self.group = group
        self.adapter = adapter

    def export_weights(
        self, kind: WeightKind, bucket_bytes: int = 0, audience: tuple[int, ...] = (),
        dtype: str | None = None, changed_only: bool = False,
    ) -> WeightPush:  # fmt: skip
        """This adapter, named whatever ``lora.sync`` says (``kind`` must be 'adapter': see
        `full_state_dict`)."""
        if kind != "adapter":
            self.full_state_dict()
        with self.group.lock:
            adapter = self.group.weights.adapter_weights(self.adapter)
        assert adapter is not None  # a named adapter of a LoRA group
        return adapter

    def send_weights(self, push: WeightPush) -> None:
        """Nothing: an adapter travels whole in its push."""

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """This adapter's full LoRA tensors, by PEFT's file keys."""
        with self.group.lock:
            return self.group.weights.adapter_state_dict(self.adapter)

    def full_state_dict(self, bucket_bytes: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Refused: the shared base never moves; the engine must take named adapters."""
        raise TrainerError(
            f"policy adapter {self.adapter!r} pushes its adapter only; its engine must take "
            "named adapters (TorchEngine, or vLLM with enable_lora)"
        )
