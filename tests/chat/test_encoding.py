"""Prompts encoded piece by piece (between added tokens) give the ids of a whole encode."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from agentrl_sdk.chat import ChatTemplate
from agentrl_sdk.chat.encoding import PieceEncoder
from agentrl_sdk.models.llama_tokenizer import build_llama3_tokenizer

TOOLS = [{
    "type": "function",
    "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
}]  # fmt: skip


def _prompts(template: ChatTemplate) -> list[str]:
    """Rendered tool loops: system turn and tools, questions, calls, results, odd spacing."""
    texts = []
    for k in range(6):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You add numbers.  Answer briefly.\n"},
            {"role": "user", "content": f" What is {k}+3?\n\n"},
            {"role": "assistant", "content": f"<tool_call>\n{{\"name\": \"add\", \"arguments\": "
                                             f"{{\"a\": {k}, \"b\": 3}}}}\n</tool_call>"},
            {"role": "tool", "content": f"{k + 3}", "tool_call_id": "c"},
        ]  # fmt: skip
        texts.append(template.render(messages, TOOLS, add_generation_prompt=True))
    return texts


class CountingTokenizer:
    """The tokenizer, counting the texts it is asked to encode."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend_tokenizer = tokenizer.backend_tokenizer
        self.encoded: list[str] = []

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.encoded.append(text)
        return self.tokenizer.encode(text, **kwargs)


def test_pieces_equal_whole_encodes(qwen_tokenizer, qwen3_tokenizer, smollm2_folder):
    tokenizers = {
        "qwen": qwen_tokenizer,
        "qwen3": qwen3_tokenizer,
        "llama3": build_llama3_tokenizer(),
        "smollm2": AutoTokenizer.from_pretrained(smollm2_folder),
    }
    for name, tokenizer in tokenizers.items():
        template = ChatTemplate(tokenizer, tool_prompt="hermes")
        encoder = PieceEncoder(tokenizer)
        for text in _prompts(template):
            assert list(encoder.encode(text)) == tokenizer.encode(text, add_special_tokens=False)
            assert template.encode(text) == tokenizer.encode(text, add_special_tokens=False)
        assert encoder.by_pieces, name  # the probes agreed


def test_a_new_prompt_encodes_only_its_new_pieces(qwen_tokenizer):
    counting = CountingTokenizer(qwen_tokenizer)
    encoder = PieceEncoder(counting)
    first, second = _prompts(ChatTemplate(qwen_tokenizer, tool_prompt="hermes"))[:2]
    encoder.encode(first)
    counting.encoded.clear()
    ids = encoder.encode(second)
    assert list(ids) == qwen_tokenizer.encode(second, add_special_tokens=False)
    # The system turn with its tools section and the turn openings come from the cache: only
    # the question, the call and the result are new.
    assert len(counting.encoded) == 3, counting.encoded
    assert not any(piece in first for piece in counting.encoded)


def _metaspace_tokenizer(**added: bool) -> PreTrainedTokenizerFast:
    words = ["<unk>", "\u2581hello", "hello", "\u2581world", "world", "<s>"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.add_special_tokens([AddedToken("<s>", special=True, normalized=False, **added)])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_tokenizer_that_reads_positions_is_encoded_whole():
    """SentencePiece's space goes before the first piece only: a piece alone would get one."""
    tokenizer = _metaspace_tokenizer()
    assert tokenizer.encode("<s>hello", add_special_tokens=False) == [5, 2]  # no space added
    encoder = PieceEncoder(tokenizer)
    assert not encoder.by_pieces  # the probes disagreed
    for text in ["<s>hello world", "hello world<s>hello", "<s>world"]:
        assert list(encoder.encode(text)) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("flag", ["lstrip", "rstrip", "single_word"])
def test_added_tokens_that_reach_beyond_themselves_are_encoded_whole(flag):
    tokenizer = _metaspace_tokenizer(**{flag: True})
    encoder = PieceEncoder(tokenizer)
    assert not encoder.by_pieces
    assert list(encoder.encode("hello <s> world")) == tokenizer.encode(
        "hello <s> world", add_special_tokens=False
    )
