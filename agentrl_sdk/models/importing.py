"""`import_model`: a GGUF file or a local HF causal-LM folder as a plain folder both engines load.

The engines (TorchEngine, vLLM) and the trainer read one layout: a ``save_pretrained`` folder
with safetensors weights, ``tokenizer.json``, the chat template and ``generation_config.json``.
A GGUF file is not one, and transformers' GGUF import (measured on SmolLM2 and a Llama-3-style
file, transformers 5.19) leaves defects this module repairs:

- ``save_pretrained`` may refuse the GGUF-loaded model (it carries a GGUF quantization config):
  the weights are dequantized to float and copied into a model built from the bare config.
- The tokenizer loses llama.cpp pre-tokenizer steps transformers has no entry for; SmolLM2's
  ``smollm`` splits digits one per token, and without it "12345" becomes other tokens than the
  model was trained on. The file's ``tokenizer.ggml.pre`` says which step to restore.
- The generation config stops only on the declared EOS id. llama.cpp also stops on the file's
  ``tokenizer.ggml.eot_token_id`` / ``eom_token_id`` (Llama 3's ``<|eot_id|>`` / ``<|eom_id|>``),
  and a chat model must stop on its template's turn markers (``<|im_end|>``, ``<|im_start|>``...),
  or it writes the next turn.
- A vocabulary without ``<|endoftext|>`` (sentencepiece: ``<s>``, ``</s>``, ``<unk>``) gets it
  appended past the file's tokens, an id with no embedding row. It is dropped, so its text is
  plain text as in llama.cpp (a resized embedding would add a row the model never learned).
- ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` are ignored; the tokenizer is set to add
  BOS / EOS as the file says when it encodes with special tokens.

HF folders go through the same load-and-save, so every imported folder is normalised the same
way. The model's own chat template is kept as it is.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from agentrl_sdk.errors import AgentRLError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "IMPORTER_VERSION",
    "TURN_MARKERS",
    "GGUFHeader",
    "ImportDType",
    "ModelImportError",
    "import_model",
    "read_gguf_header",
    "restore_pre_tokenizer",
    "turn_stop_ids",
]

logger = logging.getLogger(__name__)

IMPORTER_VERSION = 2
"""Bumped whenever an import's output changes, so cached imports (`cached_build`) are redone."""

ImportDType = Literal["float32", "bfloat16", "float16"]

TURN_MARKERS: tuple[str, ...] = (
    "<|im_end|>",
    "<|im_start|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<start_of_turn>",
)
"""Tokens that end or open a chat turn; a stop id when the chat template writes them."""

# llama.cpp pre-tokenizers (``tokenizer.ggml.pre``) that split every digit before the GPT-2
# regex (llama-vocab.cpp: starcoder, refact, command-r, smollm, codeshell, exaone, minerva).
_DIGIT_SPLITTING_PRE = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
)
# Plain GPT-2 regex: what transformers' byte-level GGUF tokenizer already does.
_GPT2_REGEX_PRE = frozenset({"default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais"})


class ModelImportError(AgentRLError):
    """The source cannot be imported; the message says what to do instead."""


class GGUFHeader(BaseModel):
    """What the importer needs from a GGUF file's metadata, read without loading tensors."""

    model_config = ConfigDict(frozen=True)

    architecture: str
    tokenizer_model: str | None = None
    pre_tokenizer: str | None = None
    token_count: int | None = None
    """Entries of ``tokenizer.ggml.tokens``: the vocabulary llama.cpp and the embedding know."""
    eos_token_id: int | None = None
    eot_token_id: int | None = None
    """End of turn (Llama 3: ``<|eot_id|>``); llama.cpp stops on it as on EOS."""
    eom_token_id: int | None = None
    """End of message awaiting a tool result (Llama 3.1: ``<|eom_id|>``); also a stop id."""
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None

    @property
    def stop_ids(self) -> list[int]:
        """The ids llama.cpp ends generation on (EOS, EOT, EOM), those the file declares."""
        ids = (self.eos_token_id, self.eot_token_id, self.eom_token_id)
        return list(dict.fromkeys(i for i in ids if i is not None))


def import_model(
    src: str | Path,
    out: str | Path,
    *,
    dtype: ImportDType = "float32",
    overwrite: bool = False,
) -> Path:
    """Writes ``src`` (a ``.gguf`` file or a local HF causal-LM folder) as the plain model folder
    ``out`` and returns it as a ``Path``.

    GGUF weights are dequantized to float32 and then cast to ``dtype``. The folder holds
    safetensors weights, the tokenizer (with the model's own chat template) and a generation
    config whose EOS ids include a GGUF's end-of-turn / end-of-message ids and the template's
    turn markers (`turn_stop_ids`).

    Args:
        src: A GGUF file, or a folder with ``config.json``, weights and tokenizer files.
        out: Folder to write; it may exist only if empty (or with ``overwrite``).
        overwrite: Write into a non-empty ``out`` (files of the same name are replaced).

    Raises:
        ModelImportError: ``src`` is missing, quantized in a way we cannot undo, of an
            architecture transformers cannot load, or ``out`` is not empty.
    """
    import torch

    src, out = Path(src).expanduser(), Path(out).expanduser()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ModelImportError(f"dtype={dtype!r}: use float32, bfloat16 or float16")
    if not src.exists():
        raise ModelImportError(f"{src} does not exist; pass a .gguf file or a local model folder")
    if src.is_file() and src.suffix.lower() != ".gguf":
        raise ModelImportError(
            f"{src} is a file but not a .gguf file; pass a GGUF file or a model folder "
            "(one with config.json)"
        )
    if out.resolve() == src.resolve():
        raise ModelImportError(f"{out} is the source itself; write the import to a new folder")
    _check_out(out, overwrite)
    started = time.perf_counter()
    model, tokenizer = _load_gguf(src) if src.is_file() else _load_folder(src)
    model = model.to(getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = turn_stop_ids(model, tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if not tokenizer.chat_template:
        logger.warning("%s has no chat template; add one to %s/chat_template.jinja", src, out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info("imported %s into %s in %.1fs", src, out, time.perf_counter() - started)
    return out


def turn_stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The declared EOS ids, then the ids of the `TURN_MARKERS` the chat template writes.

    A model that ends its turn with ``<|im_end|>`` but only declares ``<|endoftext|>`` (or
    that skips ``<|im_end|>`` and opens the next turn with ``<|im_start|>``) would otherwise
    write the user's next turn itself.
    """
    declared = [
        *_as_ids(getattr(model.generation_config, "eos_token_id", None)),
        *_as_ids(getattr(model.config, "eos_token_id", None)),
        *_as_ids(tokenizer.eos_token_id),
    ]
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    markers = [vocab[t] for t in TURN_MARKERS if t in template and t in vocab]
    return list(dict.fromkeys(declared + markers))


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ModelImportError(f"{out} is a file; give a folder to write the model into")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ModelImportError(
            f"{out} is not empty; choose a new folder or pass overwrite=True (--overwrite)"
        )


# --- GGUF -------------------------------------------------------------------------------------


def read_gguf_header(path: Path) -> GGUFHeader:
    """The architecture and tokenizer facts of a GGUF file (memory-mapped, tensors untouched).

    transformers' own metadata reader skips the token arrays (0.02 s on SmolLM2); gguf's
    ``GGUFReader``, the fallback, parses all 98k token and merge strings (~4.5 s).
    """
    try:
        import gguf  # noqa: F401 - transformers' GGUF loading needs it either way
    except ImportError as exc:
        raise ModelImportError(
            "importing a GGUF file needs the gguf package: pip install 'agentrl-sdk[real]' "
            "(or pip install gguf)"
        ) from exc
    try:
        metadata = _gguf_metadata(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a GGUF we can read"
        raise ModelImportError(f"{path} is not a readable GGUF file: {exc}") from exc
    architecture = metadata.get("general.architecture")
    if architecture is None:
        raise ModelImportError(f"{path} has no general.architecture: not a model GGUF file")
    # GGUFHeader's fields are the ``tokenizer.ggml.*`` keys, but for the first three.
    fields = {"tokenizer_model": "model", "pre_tokenizer": "pre", "token_count": "tokens"}
    return GGUFHeader(architecture=architecture, **{
        name: metadata.get(f"tokenizer.ggml.{fields.get(name, name)}")
        for name in GGUFHeader.model_fields if name != "architecture"})


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's metadata, ``tokenizer.ggml.tokens`` (a string array) as its length."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:
        return _gguf_metadata_by_gguf(path)
    return read_gguf_metadata(str(path))[0]  # string arrays come as their lengths


def _gguf_metadata_by_gguf(path: Path) -> dict[str, Any]:
    """As `_gguf_metadata` (every array as its length), with gguf's reader, ~4.5 s on SmolLM2."""
    from gguf import GGUFReader, GGUFValueType

    metadata: dict[str, Any] = {}
    for key, field in GGUFReader(path).fields.items():
        if field.types[0] == GGUFValueType.ARRAY:
            metadata[key] = len(field.data)
        elif field.types[0] == GGUFValueType.STRING:
            metadata[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            metadata[key] = field.parts[field.data[0]][0].item()
    return metadata


def _supported_gguf_architectures() -> set[str] | None:
    """GGUF architectures this transformers can load (``None``: it does not say)."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return None
    names = set(GGUF_SUPPORTED_ARCHITECTURES)
    with contextlib.suppress(ImportError):
        from transformers.integrations.gguf import GGUF_ARCHS

        names.update(GGUF_ARCHS)
    return names - {"general", "tokenizer"}


def _load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantized float32 model and tokenizer from a GGUF file, both repaired (module doc)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    header = read_gguf_header(path)
    supported = _supported_gguf_architectures()
    # Spelled as transformers renames llama.cpp's names (qwen2moe, gpt-oss, t5encoder, ...).
    spelled = header.architecture.replace("-", "_").replace("2moe", "2_moe")
    spelled = "t5" if spelled == "t5encoder" else spelled.replace("3moe", "3_moe")
    if supported is not None and not {header.architecture, spelled} & supported:
        raise ModelImportError(
            f"{path.name}: GGUF architecture {header.architecture!r} is not one transformers "
            f"can load ({', '.join(sorted(supported))}); convert the original HF checkpoint "
            "folder instead (agentrl import-model FOLDER OUT)"
        )
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    restore_pre_tokenizer(tokenizer, header)
    _drop_tokens_past_vocabulary(tokenizer, header)
    _restore_add_special_tokens(tokenizer, header, path)
    loaded = AutoModelForCausalLM.from_pretrained(
        path.parent,
        dtype=torch.float32,
        # Dense float weights even where transformers could keep GGUF blocks packed.
        quantization_config=GgufConfig(dequantize=True),
        **kwargs,
    )
    context = getattr(loaded.config, "max_position_embeddings", None)
    if context and tokenizer.model_max_length > 10**12:  # a GGUF gives only the context length
        tokenizer.model_max_length = context
    model = _plain_copy(loaded)
    # transformers reads only the EOS id; llama.cpp also stops on the file's EOT and EOM ids.
    declared = _as_ids(model.generation_config.eos_token_id) + header.stop_ids
    model.generation_config.eos_token_id = list(dict.fromkeys(declared))
    return model, tokenizer


def restore_pre_tokenizer(tokenizer: PreTrainedTokenizerBase, header: GGUFHeader) -> None:
    """Puts back the digit split that ``tokenizer.ggml.pre`` names and transformers drops.

    SmolLM2's own ``tokenizer.json`` pre-tokenizes with ``Digits(individual_digits=True)`` then
    ``ByteLevel``; transformers' GGUF import keeps only ``ByteLevel``. Pre-tokenizers
    transformers knows (llama3, qwen2, ...) and plain GPT-2 are left as they are; an unknown
    name is logged, since ids may then differ from the model's original tokenizer.
    """
    from tokenizers import pre_tokenizers

    if header.tokenizer_model != "gpt2" or header.pre_tokenizer is None:
        return
    name = header.pre_tokenizer
    if name in _DIGIT_SPLITTING_PRE:
        backend = tokenizer.backend_tokenizer
        if "Digits" in backend.to_str():
            return
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    elif name not in _GPT2_REGEX_PRE and name not in _transformers_pre_tokenizers():
        logger.warning(
            "GGUF pre-tokenizer %r is unknown to the importer; text may split into other "
            "tokens than with the model's original tokenizer (import the HF folder if you have it)",
            name,
        )


def _drop_tokens_past_vocabulary(tokenizer: PreTrainedTokenizerBase, header: GGUFHeader) -> None:
    """Removes the tokens transformers appends after the file's ``header.token_count`` tokens.

    Its GGUF tokenizer builders add their default special tokens (``<|endoftext|>`` for a
    byte-level BPE) when the vocabulary has none, with ids the embedding has no row for.
    """
    from tokenizers import Tokenizer

    count = header.token_count
    if count is None or len(tokenizer) <= count:
        return
    backend = tokenizer.backend_tokenizer
    state = json.loads(backend.to_str())
    dropped = [t["content"] for t in state["added_tokens"] if t["id"] >= count]
    state["added_tokens"] = [t for t in state["added_tokens"] if t["id"] < count]
    rebuilt = Tokenizer.from_str(json.dumps(state))
    rebuilt.encode_special_tokens = backend.encode_special_tokens
    tokenizer._tokenizer = rebuilt  # the backend tokenizer has no public setter
    if len(tokenizer) != count:
        raise ModelImportError(
            f"the tokenizer has {len(tokenizer)} tokens after dropping {dropped}, the GGUF file "
            f"{count}: its ids would not match the model's embedding"
        )
    logger.info("dropped %s, which transformers appended past the GGUF vocabulary", dropped)


def _restore_add_special_tokens(
    tokenizer: PreTrainedTokenizerBase, header: GGUFHeader, path: Path
) -> None:
    """Makes encoding add BOS / EOS as ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say.

    The flags set the backend's post-processor, which ``tokenizer.json`` saves (transformers 5
    keeps the flags themselves out of ``tokenizer_config.json``). For a flag whose token the file
    does not declare transformers would quietly add nothing; llama.cpp refuses such a file, and
    so does this.
    """
    for flag, token in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        value = getattr(header, flag)
        if value is None:
            continue
        if value and getattr(tokenizer, token) is None:
            raise ModelImportError(
                f"{path.name} sets {flag} but declares no {token}; fix the file's metadata "
                "(gguf's gguf_new_metadata) or import the HF folder"
            )
        setattr(tokenizer, flag, value)


def _transformers_pre_tokenizers() -> frozenset[str]:
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_PRE_TOKENIZER_SPLITS,
        )
    except ImportError:
        return frozenset()
    return frozenset(GGUF_PRE_TOKENIZER_SPLITS)


def _plain_copy(loaded: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model built from the config minus its GGUF quantization config.

    ``save_pretrained`` refuses (or writes a GGUF-flavoured config for) a model that still
    carries the quantizer; a fresh model has nothing of GGUF left but the weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model


# --- HF folders -------------------------------------------------------------------------------


def _load_folder(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A local HF causal LM and its tokenizer, in float32; never looked up on a hub."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        hint = f"; to import the GGUF file pass it itself: {ggufs[0]}" if ggufs else ""
        raise ModelImportError(f"{path} has no config.json, so it is no HF model folder{hint}")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if quantization := getattr(config, "quantization_config", None):
        method = (
            quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        )
        raise ModelImportError(
            f"{path} is a quantized checkpoint ({method}); import its float original, or a GGUF "
            "file of it"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        )
    except ValueError as exc:
        raise ModelImportError(
            f"{path}: transformers cannot load model type {config.model_type!r} as a causal LM "
            f"({exc}); only decoder-only text models (Llama, Qwen, Mistral, Gemma, ...) import"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelImportError(
            f"{path} has no usable tokenizer ({exc}); copy the model's tokenizer files "
            "(tokenizer.json, tokenizer_config.json) into it"
        ) from exc
    return model, tokenizer
