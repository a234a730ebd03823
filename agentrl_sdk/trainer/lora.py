"""LoRA on the trainer's model: PEFT adapters injected before FSDP2 shards the model, and the
pieces that name them for the engines and for PEFT's adapter files (merging itself is
`agentrl_sdk.weights.adapters.merged_weight`, shared with the engines).

PEFT's LoRA layers are plain modules holding ``nn.Linear`` children (``base_layer``,
``lora_A.default``, ``lora_B.default``), so FSDP2 shards them with their decoder layer like any
other parameter: frozen base and trainable adapters share one all-gather, and only the adapters
get gradients. The engines never see PEFT names: their keys are the base model's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from peft import LoraConfig as PeftLoraConfig
    from torch import nn

    from agentrl_sdk.trainer.config import LoraConfig

__all__ = [
    "ADAPTER",
    "AdaptedWeight",
    "activate_adapter",
    "adapted_weights",
    "adapter_file_key",
    "adapters_disabled",
    "engine_key",
    "inject_lora",
    "lora_dropout_active",
    "peft_config",
]

ADAPTER = "default"
"""PEFT's name of the trainer's first (or only) adapter: the default policy's."""


@dataclass(frozen=True)
class AdaptedWeight:
    """Where the pieces of one adapted weight live in the trainer's state dict."""

    base: str  # ...q_proj.base_layer.weight
    lora_a: str  # ...q_proj.lora_A.default.weight, (r, in)
    lora_b: str  # ...q_proj.lora_B.default.weight, (out, r)
    fan_in_fan_out: bool  # the base stores (in, out) (GPT-2's Conv1D)


def peft_config(config: LoraConfig) -> PeftLoraConfig:
    """PEFT's `LoraConfig` for ours (what the trainer injects; the tests' PEFT reference)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def inject_lora(
    model: nn.Module, config: LoraConfig, seed: int, names: Sequence[str] = (ADAPTER,)
) -> dict[str, AdaptedWeight]:
    """Adds adapters to ``model`` in place and freezes everything else.

    The adapters are initialised from ``seed`` alone, so every rank builds the same ones before
    FSDP2 keeps its shard of them (and PEFT's own ``get_peft_model`` after ``manual_seed(seed)``
    builds them too). The caller's RNG state is left as it was. With several ``names``
    (several policies as adapters of one base) each is a PEFT adapter of its own, initialised
    from ``seed`` the same way; the first is active (`activate_adapter`).

    Returns:
        The first adapter's adapted weights, by their engine key (see `adapted_weights`).

    Raises:
        ValueError: A target module is not a linear layer (only those are merged here), or
            none matched (PEFT's message).
    """
    try:
        from peft import inject_adapter_in_model
    except ImportError as exc:
        raise ImportError(
            "trainer.lora needs PEFT: pip install 'agentrl-sdk[lora]' (or peft)"
        ) from exc

    model.requires_grad_(False)
    training = model.training
    for adapter in names:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inject_adapter_in_model(peft_config(config), model, adapter_name=adapter)
    model.train(training)  # new modules start in train mode: their dropout would be on
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    activate_adapter(model, names[0])
    return adapted_weights(model, names[0])


def adapted_weights(model: nn.Module, adapter: str = ADAPTER) -> dict[str, AdaptedWeight]:
    """Every weight LoRA ``adapter`` adapts in ``model``, by its engine key (``...q_proj.weight``)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    found: dict[str, AdaptedWeight] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear):
            raise ValueError(
                f"lora.target_modules matched {name} ({type(module).__name__}); only linear "
                "layers can be adapted (name them, or use 'all-linear')"
            )
        if adapter not in module.lora_A:
            continue
        found[f"{name}.weight"] = AdaptedWeight(
            base=f"{name}.base_layer.weight",
            lora_a=f"{name}.lora_A.{adapter}.weight",
            lora_b=f"{name}.lora_B.{adapter}.weight",
            fan_in_fan_out=bool(module.fan_in_fan_out),
        )
    return found


def engine_key(key: str) -> str | None:
    """The base model's name of a trainer state key; None for an adapter tensor."""
    if ".lora_" in key:
        return None
    return key.replace(".base_layer.", ".")


def adapter_file_key(key: str, adapter: str = ADAPTER) -> str:
    """The key PEFT's ``adapter_model.safetensors`` uses for a trainer key of ``adapter``."""
    return "base_model.model." + key.replace(f".{adapter}.", ".")


def activate_adapter(model: nn.Module, adapter: str) -> None:
    """Makes ``adapter`` the one PEFT's LoRA layers apply in the forward.

    Sets the attribute PEFT's forward reads rather than calling ``set_adapter``, which also
    freezes the other adapters (see `adapters_disabled` for why ``requires_grad`` must not
    flip under FSDP2): an inactive adapter gets no gradient because its modules do not run.
    """
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module._active_adapter = [adapter]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model alone for the block (the KL reference under LoRA, no second copy).

    Sets the flag PEFT's LoRA forward reads rather than calling ``enable_adapters(False)``:
    that also flips ``requires_grad``, and FSDP2 builds its unsharded parameters with the
    flag they first see, so the adapters could stop getting gradients.
    """
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


@contextlib.contextmanager
def lora_dropout_active(model: nn.Module, active: bool) -> Iterator[None]:
    """Puts the adapters' dropout in train mode for the block; the rest stays in eval mode."""
    dropouts = [m for n, m in model.named_modules() if n.rsplit(".", 2)[-2:-1] == ["lora_dropout"]]
    for module in dropouts:
        module.train(active)
    try:
        yield
    finally:
        for module in dropouts:
            module.train(False)
