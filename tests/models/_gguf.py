"""Tiny Llama GGUF files for the import tests, written the way llama.cpp's converter writes them.

`write_gguf` stores a Llama state dict (F32 norms and embedding, Q8_0 / Q4_1 layers, a Q8_0
output) with a byte-level BPE from `train_tokenizer`; ``declare`` writes the special token ids,
flags and chat template (by default SmolLM2's: `declare_chatml`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

Q = gguf.GGMLQuantizationType
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
DIMS = {"vocab": 320, "hidden": 64, "ffn": 128, "layers": 2, "heads": 4, "kv_heads": 2, "ctx": 256}
# How each layer's matrices are stored; norms stay F32, the embedding F32, the output Q8_0.
LAYER_TYPES = {0: Q.Q8_0, 1: Q.Q4_1}


def train_tokenizer(specials: list[str] = SPECIALS, vocab: int = DIMS["vocab"]) -> Tokenizer:
    """Byte-level BPE with SmolLM2's pre-tokenizer (digits one per token, then GPT-2 regex).

    Trained without the digit split, so the vocabulary holds multi-digit merges ("12") and
    a tokenizer that lost the split gives other ids. ``specials`` take ids 0, 1, ...
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "the quick brown fox jumps over the lazy dog", "what is the sum of 12 and 30",
        "a helpful assistant answers the question", "hello world, how are you today?",
        "user: please compute the product; assistant: it is 42",
    ] * 20  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == vocab and "12" in tok.get_vocab()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return tok


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved), which the importer must undo."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    names = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }  # fmt: skip
    if hf in names:
        return names[hf]
    layer, rest = hf.split(".")[2], ".".join(hf.split(".")[3:])
    parts = {
        "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
        "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
        "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
        "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up",
        "mlp.down_proj.weight": "ffn_down",
    }  # fmt: skip
    return f"blk.{layer}.{parts[rest]}.weight"


def storage(hf: str) -> Q:
    """The GGML type a tensor of the HF name ``hf`` is stored as."""
    if hf == "lm_head.weight":
        return Q.Q8_0
    if hf.endswith("proj.weight"):
        return LAYER_TYPES[int(hf.split(".")[2])]
    return Q.F32


def declare_chatml(writer: gguf.GGUFWriter) -> None:
    """SmolLM2's declarations: bos ``<|im_start|>``, eos and pad ``<|im_end|>``, ChatML."""
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def write_gguf(
    path: Path,
    state: dict[str, torch.Tensor],
    tok: Tokenizer,
    pre: str,
    *,
    dims: dict[str, int] = DIMS,
    specials: list[str] = SPECIALS,
    declare: Callable[[gguf.GGUFWriter], None] = declare_chatml,
) -> None:
    """Writes ``state`` (a `reference_model`'s) and ``tok`` as a Llama GGUF file at ``path``."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(dims["layers"])
    writer.add_context_length(dims["ctx"])
    writer.add_embedding_length(dims["hidden"])
    writer.add_feed_forward_length(dims["ffn"])
    writer.add_head_count(dims["heads"])
    writer.add_head_count_kv(dims["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(dims["hidden"] // dims["heads"])
    writer.add_vocab_size(dims["vocab"])
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # 3: control
    writer.add_token_merges(merges)
    declare(writer)
    for name, tensor in state.items():
        data = tensor.numpy().astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = _permute(data, dims["heads"])
        elif name.endswith("k_proj.weight"):
            data = _permute(data, dims["kv_heads"])
        qtype = storage(name)
        stored = data if qtype == Q.F32 else gguf.quants.quantize(data, qtype)
        writer.add_tensor(_gguf_name(name), stored, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def reference_model(dims: dict[str, int] = DIMS) -> LlamaForCausalLM:
    """A seeded untied Llama of ``dims``, norms moved off ones."""
    config = LlamaConfig(
        vocab_size=dims["vocab"], hidden_size=dims["hidden"], intermediate_size=dims["ffn"],
        num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"], max_position_embeddings=dims["ctx"],
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        for name, p in model.named_parameters():
            if "norm" in name:  # norms init to ones: make their F32 copy a real check
                p.data += 0.1 * torch.randn_like(p)
    return model.eval()
