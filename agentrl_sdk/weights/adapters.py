"""LoRA adapter tensors as engines receive them, the one formula that merges them, and the
PEFT adapter folder that vLLM and PEFT load.

The trainer and the engines both merge with `merged_weight`, so a weight an engine merged from
an adapter push is, bit for bit, the weight a merged push would have sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["AdapterWeights", "merged_weight", "write_adapter_folder"]

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
    (``base_model.model.<module>.lora_A.weight``), and how they combine with the base.

    A `WeightPush` of kind ``adapter``; pickled (to a Ray actor) as numpy arrays."""

    kind: ClassVar[Literal["adapter"]] = "adapter"
    tensors: Mapping[str, torch.Tensor]
    scaling: float  # alpha / rank
    fan_in_fan_out: frozenset[str] = field(default_factory=frozenset)  # engine keys stored (in, out)
    # None: the engine merges the adapter into the weights it serves. A name: the engine keeps
    # it apart and applies it to the requests whose ``SamplingParams.adapter`` names it.
    name: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        from agentrl_sdk.weights.tensor_transport import PackedTensors

        packed = PackedTensors.pack(self.tensors)
        return _unpacked_adapter, (packed, self.scaling, self.fan_in_fan_out, self.name)

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
        if incomplete := sorted(k for k, p in pairs.items() if len(p) != 2):
            raise ValueError(f"adapter lacks lora_A or lora_B for {incomplete[:5]}")
        return {k: (p["A"], p["B"]) for k, p in pairs.items()}

    @property
    def rank(self) -> int:
        """r: the rows of every A (one rank for the whole adapter)."""
        ranks = {a.shape[0] for a, _ in self.by_weight().values()}
        if len(ranks) != 1:
            raise ValueError(f"adapter mixes ranks {sorted(ranks)}; one rank is supported")
        return ranks.pop()


def write_adapter_folder(
    path: str | Path, adapter: AdapterWeights, base_model: str | None = None
) -> Path:
    """Writes ``adapter`` as a PEFT adapter folder: ``adapter_config.json`` (LoRA, r,
    ``lora_alpha = scaling * r``, the adapted module names) and ``adapter_model.safetensors``.

    PEFT (``PeftModel.from_pretrained``) and vLLM (``LoRARequest``) load it. Returns the folder.
    """
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    weights = adapter.by_weight()
    rank = adapter.rank
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": adapter.scaling * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({key.rsplit(".", 2)[-2] for key in weights}),
        "fan_in_fan_out": bool(adapter.fan_in_fan_out),
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.detach().contiguous() for k, v in adapter.tensors.items()}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    return folder


def _unpacked_adapter(
    packed: Any, scaling: float, fan_in_fan_out: frozenset[str], name: str | None
) -> AdapterWeights:
    return AdapterWeights(packed.unpack(), scaling, fan_in_fan_out, name)
