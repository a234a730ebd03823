"""LoRA adapter tensors as engines receive them, and the one formula that merges them.

The trainer and the engines both merge with `merged_weight`, so a weight an engine merged from
an adapter push is, bit for bit, the weight a merged push would have sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["AdapterEngine", "AdapterWeights", "merged_weight"]

_FILE_PREFIX = "base_model.model."


def merged_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
    fan_in_fan_out: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``W + scaling * B @ A``: the weight the adapted layer computes with (PEFT's order of
    operations, so it matches ``merge_and_unload`` to the bit)."""
    delta = lora_b @ lora_a  # (out, r) @ (r, in) -> (out, in)
    if fan_in_fan_out:
        delta = delta.T
    return base + delta * scaling


@dataclass(frozen=True)
class AdapterWeights:
    """One LoRA adapter: full A and B tensors by the keys of PEFT's ``adapter_model.safetensors``
    (``base_model.model.<module>.lora_A.weight``), and how they combine with the base."""

    tensors: Mapping[str, torch.Tensor]
    scaling: float  # alpha / rank
    fan_in_fan_out: frozenset[str] = field(default_factory=frozenset)  # engine keys stored (in, out)

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter tensors (what an adapter push moves)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def by_weight(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``(A, B)`` by the engine key of the weight they adapt (``<module>.weight``).

        Raises:
            ValueError: A key is not a LoRA A/B key, or a module lacks one of the pair.
        """
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in self.tensors.items():
            module, _, part = key.removeprefix(_FILE_PREFIX).rpartition(".lora_")
            if not module or part not in ("A.weight", "B.weight"):
                raise ValueError(f"{key!r} is not a LoRA A/B key of adapter_model.safetensors")
            pairs.setdefault(f"{module}.weight", {})[part[0]] = tensor
        incomplete = sorted(k for k, p in pairs.items() if len(p) != 2)
        if incomplete:
            raise ValueError(f"adapter lacks lora_A or lora_B for {incomplete[:5]}")
        return {k: (p["A"], p["B"]) for k, p in pairs.items()}


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that takes an adapter push: it merges the adapter into its own base copy."""

    async def update_adapter(self, adapter: AdapterWeights) -> int:
        """Serve ``base + adapter`` from now on; returns the new policy version."""
        ...
