"""Named LoRA adapters applied per batch row: one forward serves rows of several policies.

Each adapted ``nn.Linear`` gets one forward hook. Before a forward the scheduler says which
adapter each row uses (`RowAdapters.rows`); the hook adds ``scaling * B(A(x))`` to the rows of
each adapter present, in PEFT's order of operations (so an adapter row's logits are those of
the trainer's PEFT model), and leaves rows without an adapter untouched: base rows compute
exactly what they computed before any adapter existed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from torch import nn

    from agentrl_sdk.weights.adapters import AdapterWeights

__all__ = ["RowAdapters"]


@dataclass(frozen=True)
class _Adapter:
    """One named adapter as the hooks use it: ``(A, B)`` by module name, in the model's dtype."""

    pairs: dict[
        str, tuple[torch.Tensor, torch.Tensor]
    ]  # module -> (A (r, in), B (out, r))
    scaling: float


class RowAdapters:
    """The named adapters an engine serves and the hooks that apply them row by row.

    Touched only by the engine thread (``set`` between forwards, ``rows`` around one).

    Args:
        model: The served model; adapted modules must be ``nn.Linear``.
    """

    def __init__(self, model: nn.Module) -> None:
        self._modules = dict(model.named_modules())
        self._adapters: dict[str, _Adapter] = {}
        self._hooked: set[str] = set()
        self._groups: list[tuple[_Adapter, torch.Tensor]] = []  # (adapter, row indices)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    @property
    def names(self) -> list[str]:
        """The adapters held, sorted."""
        return sorted(self._adapters)

    def set(self, name: str, adapter: AdapterWeights) -> None:
        """Serve ``adapter`` as ``name`` from the next forward on (replacing a previous one).

        Raises:
            KeyError: It adapts a weight the model lacks.
            TypeError: An adapted module is not ``nn.Linear``.
            ValueError: A shape does not fit.
        """
        pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, (lora_a, lora_b) in adapter.by_weight().items():
            module_name = key.removesuffix(".weight")
            module = self._modules.get(module_name)
            if module is None:
                raise KeyError(
                    f"the adapter adapts {key!r}, which the served model lacks"
                )
            if not isinstance(module, torch.nn.Linear):
                raise TypeError(f"{module_name} is a {type(module).__name__}; per-row "
                                 "adapters need nn.Linear modules")  # fmt: skip
            dtype = module.weight.dtype
            if (
                lora_a.shape[1] != module.in_features
                or lora_b.shape[0] != module.out_features
            ):
                raise ValueError(
                    f"adapter shapes A {tuple(lora_a.shape)}, B {tuple(lora_b.shape)} do not fit "
                    f"{module_name} ({module.in_features} -> {module.out_features})"
                )
            pairs[module_name] = (
                lora_a.detach().to(dtype).contiguous(),
                lora_b.detach().to(dtype).contiguous(),
            )
        for module_name in pairs.keys() - self._hooked:
            self._modules[module_name].register_forward_hook(self._hook)
            self._hooked.add(module_name)
        self._adapters[name] = _Adapter(pairs, adapter.scaling)

    @contextlib.contextmanager
    def rows(self, names: Sequence[str | None]) -> Iterator[None]:
        """For one forward: row ``b`` uses adapter ``names[b]`` (None: the base alone).

        Raises:
            KeyError: A name is not held (checked before the forward).
        """
        groups = []
        for name in sorted({n for n in names if n is not None}):
            index = torch.tensor(
                [b for b, n in enumerate(names) if n == name], dtype=torch.long
            )
            groups.append((self._adapters[name], index))
        self._groups = groups
        try:
            yield
        finally:
            self._groups = []

    def _hook(
        self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor
    ) -> Any:
        if not self._groups:
            return None
        name = self._name_of(module)
        x = inputs[0]  # (B, L, in)
        for adapter, index in self._groups:
            pair = adapter.pairs.get(name)
            if pair is None:
                continue
            lora_a, lora_b = pair
            rows = x.index_select(0, index)  # (b, L, in)
            delta = (
                F.linear(F.linear(rows, lora_a), lora_b) * adapter.scaling
            )  # (b, L, out)
            output = output.index_add(0, index, delta)
        return output

    def _name_of(self, module: nn.Module) -> str:
        # Hooks share one function; the module's name is looked up once and cached on it.
        name = getattr(module, "_agentrl_adapter_name", None)
        if name is None:
            name = next(n for n, m in self._modules.items() if m is module)
            module._agentrl_adapter_name = name
        return name
