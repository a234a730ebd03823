"""What `import_model` restores of a GGUF's token declarations that transformers' import loses.

The file here is Llama-3-shaped: it declares ``tokenizer.ggml.eot_token_id`` and
``eom_token_id`` (markers `TURN_MARKERS` does not know), ``add_bos_token``, and has no
``<|endoftext|>``. Its model is degenerate: every embedding is hidden unit 0 and the output has
one non-zero row, the end-of-turn token's, so greedy decoding writes that token first whatever
the prompt. An engine that does not stop on it goes on writing it until ``max_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.models import ModelImportError, import_model  # noqa: E402
from agentrl_sdk.models import importing  # noqa: E402
from agentrl_sdk.types import SamplingParams  # noqa: E402
from tests.models._gguf import reference_model, train_tokenizer, write_gguf  # noqa: E402

SPECIALS = ["<|begin|>", "<|end_of_text|>", "<|reply_end|>", "<|call_end|>", "<|header|>"]
BOS, EOS, EOT, EOM = 0, 1, 2, 3
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|header|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|reply_end|>{% endfor %}{% if add_generation_prompt %}<|header|>assistant\n{% endif %}"
)
# head_dim 64: a size every vLLM CPU attention kernel supports.
DIMS = {"vocab": 320, "hidden": 128, "ffn": 128, "layers": 2, "heads": 2, "kv_heads": 1, "ctx": 256}


def _declare(writer: gguf.GGUFWriter) -> None:
    """As llama.cpp writes a Llama 3 file: no unk, no pad, BOS added on encoding."""
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_eot_token_id(EOT)
    writer.add_eom_token_id(EOM)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)


def _says_end_of_turn(dims: dict[str, int]) -> dict[str, torch.Tensor]:
    """Zero layers; embeddings e_0; the output row of `EOT` e_0: greedy writes `EOT`."""
    state = {k: torch.zeros_like(v) for k, v in reference_model(dims).state_dict().items()}
    for name, tensor in state.items():
        if "norm" in name:
            tensor.fill_(1.0)
    state["model.embed_tokens.weight"][:, 0] = 1.0
    state["lm_head.weight"][EOT, 0] = 1.0
    return state


@pytest.fixture(scope="module")
def llama3_style_gguf(tmp_path_factory) -> tuple[Path, Tokenizer]:
    tok = train_tokenizer(SPECIALS, DIMS["vocab"])
    path = tmp_path_factory.mktemp("gguf") / "llama3-style.gguf"
    state = _says_end_of_turn(DIMS)
    write_gguf(path, state, tok, pre="smollm", dims=DIMS, specials=SPECIALS, declare=_declare)
    return path, tok


@pytest.fixture(scope="module")
def imported(llama3_style_gguf, tmp_path_factory) -> Path:
    return import_model(llama3_style_gguf[0], tmp_path_factory.mktemp("imported") / "out")


def test_the_header_has_the_token_declarations_with_either_reader(llama3_style_gguf, monkeypatch):
    want = importing.GGUFHeader(
        architecture="llama", tokenizer_model="gpt2", pre_tokenizer="smollm", token_count=320,
        eos_token_id=EOS, eot_token_id=EOT, eom_token_id=EOM, add_bos_token=True,
    )  # fmt: skip
    assert importing.read_gguf_header(llama3_style_gguf[0]) == want
    monkeypatch.setattr(importing, "_gguf_metadata", importing._gguf_metadata_by_gguf)
    assert importing.read_gguf_header(llama3_style_gguf[0]) == want
    assert want.stop_ids == [EOS, EOT, EOM]


def test_end_of_turn_and_end_of_message_are_stop_ids(imported) -> None:
    eos = json.loads((imported / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [EOS, EOT, EOM]


@pytest.mark.parametrize("engine", ["torch", pytest.param("vllm", marks=pytest.mark.slow)])
async def test_the_engines_stop_after_the_end_of_turn_token(imported, engine, request) -> None:
    if engine == "vllm":
        request.getfixturevalue("vllm_env")
        from agentrl_sdk.engines.vllm.engine import VLLMEngine

        served = VLLMEngine(imported, max_batch_size=2, max_model_len=256, cpu_threads=1)
    else:
        served = TorchEngine.from_pretrained(imported, dtype=torch.float32)
    try:
        result = await served.generate([BOS, 40, 41], SamplingParams(temperature=0.0, max_tokens=8), "r")
    finally:
        served.close()
    assert (result.token_ids, result.finish_reason) == ([EOT], "stop")


def test_no_token_is_appended_past_the_embedding(llama3_style_gguf, imported) -> None:
    _, original = llama3_style_gguf
    tokenizer = AutoTokenizer.from_pretrained(imported, local_files_only=True)
    rows = json.loads((imported / "config.json").read_text())["vocab_size"]
    assert len(tokenizer) == rows == DIMS["vocab"]
    # transformers gave "<|endoftext|>" id 320, one past the embedding; llama.cpp reads it as text.
    assert tokenizer.encode("<|endoftext|>", add_special_tokens=False) == original.encode("<|endoftext|>").ids
    assert tokenizer.encode("<|reply_end|><|call_end|>", add_special_tokens=False) == [EOT, EOM]


def test_encoding_adds_bos_as_the_file_says(llama3_style_gguf, imported) -> None:
    _, original = llama3_style_gguf
    tokenizer = AutoTokenizer.from_pretrained(imported, local_files_only=True)
    text = "hello world, 12 and 30"
    assert tokenizer.encode(text) == [BOS, *original.encode(text).ids]
    assert tokenizer.encode(text, add_special_tokens=False) == original.encode(text).ids


def test_add_bos_token_without_a_bos_token_is_refused(tmp_path) -> None:
    def declare(writer: gguf.GGUFWriter) -> None:
        writer.add_eos_token_id(EOS)
        writer.add_add_bos_token(True)

    tok, path = train_tokenizer(SPECIALS, DIMS["vocab"]), tmp_path / "no-bos.gguf"
    write_gguf(path, _says_end_of_turn(DIMS), tok, pre="smollm", dims=DIMS, specials=SPECIALS, declare=declare)
    with pytest.raises(ModelImportError, match="no-bos.gguf sets add_bos_token but declares no bos_token"):
        import_model(path, tmp_path / "out")
