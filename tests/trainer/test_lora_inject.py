"""LoRA injection on one process: the same adapters from the same seed on every rank, only
adapters train, engine and file key names, dropout only inside training forwards, and the base
alone with adapters disabled."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.models import build_small_tokenizer, build_tiny_model
from agentrl_sdk.trainer import LoraConfig
from agentrl_sdk.trainer.lora import (
    adapter_file_key,
    adapters_disabled,
    engine_key,
    inject_lora,
    lora_dropout_active,
)

IDS = torch.tensor([[5, 17, 301, 42, 9, 77]])


@pytest.fixture(scope="module")
def tokenizer():
    return build_small_tokenizer()


def adapted_model(tokenizer, config: LoraConfig, seed: int = 3):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2).eval()
    adapted = inject_lora(model, config, seed)
    with torch.no_grad():  # a fresh B is zero: make the adapters count
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model, adapted


def test_same_seed_same_adapters_and_only_adapters_train(tokenizer):
    rng = torch.get_rng_state()
    (a, adapted), (b, _) = (adapted_model(tokenizer, LoraConfig(rank=2)) for _ in range(2))
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left alone
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    trained = [n for n, p in a.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    pieces = adapted["model.layers.0.mlp.down_proj.weight"]  # 'all-linear': the MLP too
    assert pieces.base == "model.layers.0.mlp.down_proj.base_layer.weight"
    assert engine_key(pieces.base) == "model.layers.0.mlp.down_proj.weight"
    assert engine_key(pieces.lora_a) is None
    assert adapter_file_key(pieces.lora_b) == (
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
    )
    assert "lm_head.weight" not in adapted


def test_dropout_only_in_training_forwards_and_disabled_adapters_give_the_base(tokenizer):
    model, _ = adapted_model(tokenizer, LoraConfig(rank=2, dropout=0.5))
    base = build_tiny_model(tokenizer, hidden_size=32, num_layers=2).eval()
    with torch.no_grad():
        plain = model(IDS).logits
        assert torch.equal(model(IDS).logits, plain)  # eval: no dropout
        with lora_dropout_active(model, True):
            dropped = model(IDS).logits
        assert not torch.allclose(dropped, plain)
        assert torch.equal(model(IDS).logits, plain)  # back to eval after the block
        with adapters_disabled(model):
            assert torch.equal(model(IDS).logits, base(IDS).logits)
        assert not torch.allclose(model(IDS).logits, base(IDS).logits)


def test_non_linear_targets_are_refused(tokenizer):
    with pytest.raises(ValueError, match="only linear layers"):
        adapted_model(tokenizer, LoraConfig(target_modules=["embed_tokens"]))
    with pytest.raises(ValueError, match="nothing_here"):
        adapted_model(tokenizer, LoraConfig(target_modules=["nothing_here"]))
