"""A small byte-level BPE with Llama 3's split regex, special tokens and a Llama-3-style template.

The project's other tokenizers all carry Qwen's tokens and ChatML; this one is a non-Qwen
tokenizer for tests of everything that must not assume Qwen (templates, stop tokens, parsers).
Nothing here touches the network.
"""

from __future__ import annotations

import functools

from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

from agentrl_sdk.models.templates import LLAMA3_TEMPLATE
from agentrl_sdk.models.tokenizers import _builtin_corpus, _trained_bpe

__all__ = ["LLAMA3_SPECIAL_TOKENS", "LLAMA3_SPLIT_PATTERN", "build_llama3_tokenizer"]

LLAMA3_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Llama 3's pre-tokenization regex: numbers split into groups of up to three digits."""

LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
"""Llama 3.1's first special tokens, in id order (128000 onwards there)."""


@functools.lru_cache(maxsize=4)
def _llama3_backend(vocab_size: int) -> Tokenizer:
    backend = _trained_bpe(vocab_size, _builtin_corpus(), LLAMA3_SPLIT_PATTERN, nfc=False)
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL_TOKENS]
    )
    return backend


def build_llama3_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Trains a small Llama-3-style byte-level BPE on the built-in corpus (well under a second).

    The learned vocabulary takes ids ``0..vocab_size-1``; :data:`LLAMA3_SPECIAL_TOKENS` follow,
    so ``<|begin_of_text|>`` is ``vocab_size`` and ``<|eot_id|>`` ``vocab_size + 9``. Training is
    deterministic. The chat template is `LLAMA3_TEMPLATE` (it writes ``<|begin_of_text|>``
    itself; encoding adds no special tokens).

    Args:
        vocab_size: Size of the learned vocabulary, special tokens excluded; 256 to ~4000.

    Returns:
        The fast tokenizer: bos ``<|begin_of_text|>``, eos ``<|eot_id|>``, pad
        ``<|end_of_text|>``.

    Raises:
        ValueError: If the built-in corpus cannot fill ``vocab_size`` symbols.
    """
    # The wrapper deep-copies the backend, so the cached one stays untouched.
    return PreTrainedTokenizerFast(
        tokenizer_object=_llama3_backend(vocab_size),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        chat_template=LLAMA3_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
