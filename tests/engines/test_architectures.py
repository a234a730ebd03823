"""Model families beyond our own Qwen2 build: the TorchEngine serves them token-exactly and the
trainer finds their decoder layers. Tiny random Mistral, Gemma, Qwen3 and Llama models."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentrl_sdk.engines.torch.engine import TorchEngine
from agentrl_sdk.trainer.layers import freeze_all_but_last
from agentrl_sdk.types import SamplingParams

VOCAB = 300
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, tie_word_embeddings=False)
FAMILIES = {
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "gemma": (GemmaConfig, GemmaForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=True)


def _model(family: str) -> torch.nn.Module:
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    return model_cls(config_cls(**SIZES, **extra)).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_torch_engine_matches_hf_greedy_and_a_full_forward(family):
    model = _model(family)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17)]
    engine = TorchEngine(model, eos_token_ids=())
    try:
        results = await asyncio.gather(*(engine.generate(p, GREEDY, f"r{i}")
                                         for i, p in enumerate(prompts)))
    finally:
        engine.close()
    model.set_attn_implementation("sdpa")  # the reference: transformers' own attention
    for prompt, result in zip(prompts, results, strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                 min_new_tokens=12, pad_token_id=0)
            expected = out[0, len(prompt):].tolist()
            logits = model(torch.tensor([prompt + expected])).logits[0, len(prompt) - 1 : -1]
        assert result.token_ids == expected
        reference = logits.log_softmax(-1).gather(1, torch.tensor(expected)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(result.logprobs), reference, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_only_the_last_layers_train(family):
    model = _model(family)
    layers = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    assert len(layers) == SIZES["num_hidden_layers"]
    freeze_all_but_last(model, layers, 1)
    trained = {name.split(".")[1] + "." + name.split(".")[2] if name.startswith("model.layers")
               else name.rsplit(".", 1)[0] for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"layers.2", "model.norm"}
