"""A tokenizer's identity: the same vocabulary gives the same fingerprint, another does not."""

from __future__ import annotations

from agentrl_sdk.identity import TokenizerIdentity, tokenizer_identity
from agentrl_sdk.models.tokenizers import build_small_tokenizer


def test_the_fingerprint_follows_the_vocabulary_not_the_template(qwen_tokenizer, qwen3_tokenizer):
    qwen, qwen3 = tokenizer_identity(qwen_tokenizer), tokenizer_identity(qwen3_tokenizer)
    small = tokenizer_identity(build_small_tokenizer())
    assert qwen.same_vocabulary(qwen3) and qwen.vocab_size == 151669
    assert not qwen.same_vocabulary(small) and small.vocab_size < 2000
    assert tokenizer_identity(qwen_tokenizer) is qwen  # computed once per tokenizer


def test_an_id_swap_changes_the_fingerprint():
    class Vocab:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return dict(self.vocab)

    a = tokenizer_identity(Vocab({"a": 0, "b": 1}))
    b = tokenizer_identity(Vocab({"a": 1, "b": 0}))
    assert not a.same_vocabulary(b)
    assert TokenizerIdentity.model_validate(a.model_dump()) == a
    assert "2 ids" in str(a)
