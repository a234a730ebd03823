"""A tokenizer's identity: its name and a fingerprint of its vocabulary, written into every trace.

Token ids mean something only under the vocabulary that made them. A trace records the
identity of the tokenizer its ids came from, so training on those ids can check that the model
being trained reads them the same way, and refuse when it does not, instead of retokenizing.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TokenizerIdentity", "tokenizer_identity"]


class TokenizerIdentity(BaseModel):
    """Which tokenizer produced a sequence of token ids.

    Two tokenizers with the same ``fingerprint`` map every id to the same token string, so ids
    recorded under one are exact under the other (their chat templates may differ: a template
    changes which ids are written, not what an id means).
    """

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="The tokenizer's ``name_or_path`` (usually the model folder).")
    fingerprint: str = Field(description="SHA-256 of the vocabulary: every (token, id) pair, "
                             "added and special tokens included.")
    vocab_size: int = Field(description="Ids in the vocabulary, added tokens included.")

    def same_vocabulary(self, other: TokenizerIdentity) -> bool:
        """Whether ids under ``other`` mean the same tokens as under this identity."""
        return self.fingerprint == other.fingerprint

    def __str__(self) -> str:
        name = self.name or "(unnamed)"
        return f"{name} (vocabulary {self.fingerprint[:12]}, {self.vocab_size} ids)"


_CACHE: weakref.WeakKeyDictionary[Any, TokenizerIdentity] = weakref.WeakKeyDictionary()


def tokenizer_identity(tokenizer: Any) -> TokenizerIdentity:
    """The identity of a Hugging Face tokenizer (anything with ``get_vocab()``).

    Computed once per tokenizer object (hashing a 150k-token vocabulary takes a fraction of a
    second), then read from a cache that forgets the tokenizer when it is gone.
    """
    try:
        return _CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(
        json.dumps(sorted(vocab.items(), key=lambda item: item[1]), ensure_ascii=False).encode()
    ).hexdigest()
    identity = TokenizerIdentity(name=str(getattr(tokenizer, "name_or_path", "") or ""),
                                 fingerprint=digest, vocab_size=len(vocab))
    try:
        _CACHE[tokenizer] = identity
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return identity
