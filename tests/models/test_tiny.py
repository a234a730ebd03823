"""Tiny Qwen2 models: sizing, seeding, stop tokens, and a save/load round trip from disk only."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.models.tiny import build_tiny_model, load_pretrained_pair, save_pretrained_pair
from agentrl_sdk.models.tokenizers import build_small_tokenizer

TEXTS = [
    "What is 12 + 7?",
    '<tool_call>\n{"name":"add","arguments":{"a":12,"b":7}}\n</tool_call>',
    "café naïve 日本語 😀\n\n  indented\ttab",
    "don't WE'RE 1234567890",
]


@pytest.fixture(scope="module")
def small_tokenizer():
    return build_small_tokenizer()


def test_tiny_model_is_sized_for_the_tokenizer(small_tokenizer, qwen_tokenizer):
    model = build_tiny_model(small_tokenizer, hidden_size=32, num_layers=3, num_heads=4,
                             num_kv_heads=1)
    config = model.config
    assert config.vocab_size == 1088  # 1050 rounded up to a multiple of 64
    assert (config.hidden_size, config.num_hidden_layers) == (32, 3)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 1)
    assert config.intermediate_size == 128
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert not model.training
    qwen = build_tiny_model(qwen_tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                            num_kv_heads=1, tie_word_embeddings=False)
    assert qwen.config.vocab_size == 151680  # 151669 -> 2370 * 64
    assert qwen.lm_head.weight.data_ptr() != qwen.model.embed_tokens.weight.data_ptr()


def test_tiny_model_stops_on_im_end_and_endoftext(small_tokenizer, qwen_tokenizer):
    assert build_tiny_model(small_tokenizer).generation_config.eos_token_id == [1026, 1024]
    assert build_tiny_model(small_tokenizer).generation_config.pad_token_id == 1024
    qwen = build_tiny_model(qwen_tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                            num_kv_heads=1)
    assert qwen.generation_config.eos_token_id == [151645, 151643]
    assert qwen.generation_config.pad_token_id == 151643
    assert qwen.config.pad_token_id == 151643


def test_seed_decides_the_weights_and_the_global_rng_is_untouched(small_tokenizer):
    state = torch.random.get_rng_state()
    a = build_tiny_model(small_tokenizer, seed=1).state_dict()
    b = build_tiny_model(small_tokenizer, seed=1).state_dict()
    c = build_tiny_model(small_tokenizer, seed=2).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_head_counts_must_divide(small_tokenizer):
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_model(small_tokenizer, hidden_size=64, num_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_tiny_model(small_tokenizer, num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize("kind", ["small", "qwen"])
def test_save_and_load_round_trip(tmp_path, kind, small_tokenizer, qwen_tokenizer):
    tokenizer = small_tokenizer if kind == "small" else qwen_tokenizer
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    folder = save_pretrained_pair(model, tokenizer, tmp_path / "pair")
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()

    loaded, loaded_tokenizer = load_pretrained_pair(folder)

    ids = torch.tensor([tokenizer.encode(TEXTS[1])])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.dtype == torch.float32 and not loaded.training
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert loaded_tokenizer.eos_token == "<|im_end|>"
    assert loaded_tokenizer.pad_token == "<|endoftext|>"
    assert set(loaded_tokenizer.all_special_tokens) == set(tokenizer.all_special_tokens)
    for text in TEXTS:
        assert loaded_tokenizer.encode(text) == tokenizer.encode(text)


def test_load_refuses_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained_pair"):
        load_pretrained_pair(tmp_path / "nope")
