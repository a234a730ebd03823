"""`ChatTemplate`: render messages with the tokenizer's own Jinja template, and encode text to ids."""

from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any

from transformers.utils.chat_template_utils import _compile_jinja_template

_SENTINEL = "\u2063agentrl-sentinel\u2063"


class ChatTemplate:
    """The tokenizer's chat template, compiled once, plus the encoding the ledger needs.

    Args:
        tokenizer: A transformers tokenizer with a ``chat_template``.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template; build it with agentrl_sdk.models or set "
                "tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        # transformers' own compiled environment: same filters (tojson) as apply_chat_template.
        self._compiled = _compile_jinja_template(tokenizer.chat_template)
        self._specials = {
            k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)
        }
        # The same texts recur: n samples share a first prompt, tool results repeat.
        self._encode_cached = lru_cache(maxsize=4096)(self._encode_uncached)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """Render ``messages`` (OpenAI-style dicts) and ``tools`` to the prompt text."""
        return self._compiled.render(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            **self._specials,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text map to their ids."""
        return list(self._encode_cached(text))

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens included."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @cached_property
    def assistant_suffix(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        text = self.render(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}],
            add_generation_prompt=False,
        )
        return text[text.rindex(_SENTINEL) + len(_SENTINEL) :]

    def closing_text(self, generated_ids: list[int]) -> str:
        """Text that closes an assistant turn after ``generated_ids``, as the template would.

        A response that ended on the template's end-of-turn token needs only the rest of the
        suffix (``\\n``); one cut by the token budget needs all of it.
        """
        if generated_ids:
            tail = self.decode(generated_ids[-1:])
            if tail and self.assistant_suffix.startswith(tail):
                return self.assistant_suffix[len(tail) :]
        return self.assistant_suffix
