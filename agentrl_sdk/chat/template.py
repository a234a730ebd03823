"""`ChatTemplate`: render messages with the tokenizer's own Jinja template (and a tool prompt
around it when the template has no tool support), and encode text to ids."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from agentrl_sdk.chat.delta import DeltaRenderer
from agentrl_sdk.chat.encoding import PieceEncoder
from agentrl_sdk.chat.sandbox import compile_chat_template
from agentrl_sdk.chat.tool_prompt import hermes_messages, renders_tools, resolve_tool_prompt
from agentrl_sdk.config import ToolPromptMode

_SENTINEL = "\u2063agentrl-sentinel\u2063"


class ChatTemplate:
    """The tokenizer's chat template, compiled once, plus the encoding the ledger needs.

    Args:
        tokenizer: A transformers tokenizer with a ``chat_template``.
        tool_prompt: How tools reach the prompt (``ChatConfig.tool_prompt``): ``native``
            renders them with the template, ``hermes`` writes them around it
            (`agentrl_sdk.chat.tool_prompt`), ``auto`` picks native when the template renders
            tools.

    Attributes:
        tool_prompt: The tool prompt in use, ``native`` or ``hermes``.
        tool_prompt_setting: The one asked for (``auto`` included).
    """

    def __init__(self, tokenizer: Any, tool_prompt: ToolPromptMode = "auto") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template; build it with agentrl_sdk.models or set "
                "tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        # transformers' sandbox, filters (tojson) and globals, as apply_chat_template has them.
        self._compiled = compile_chat_template(tokenizer.chat_template)
        self._specials = {
            k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)
        }
        # The same pieces recur: every rollout's system turn and tools, each turn's opening.
        self._encoder = PieceEncoder(tokenizer)
        self._renders_tools = renders_tools(lambda m, t: self._render_native(m, t, True))
        name = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}"
        self.tool_prompt_setting = tool_prompt
        self.tool_prompt = resolve_tool_prompt(tool_prompt, self._renders_tools, name)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """Render ``messages`` (OpenAI-style dicts) and ``tools`` to the prompt text.

        Raises:
            ValueError: If ``tools`` are given, the tool prompt is ``native`` and the template
                ignores tools (they would vanish from the prompt).
        """
        if self.tool_prompt == "hermes":
            messages, tools = hermes_messages(messages, tools), None
        elif tools and not self._renders_tools:
            raise ValueError(
                "the model's chat template ignores tools, so they would vanish from the prompt; "
                "set rollout.chat.tool_prompt: hermes (or auto) to write a Hermes-style tools section "
                "around it"
            )
        return self._render_native(messages, tools, add_generation_prompt)

    def _render_native(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        return self._compiled.render(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            **self._specials,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text map to their ids."""
        return list(self._encoder.encode(text))

    def count(self, text: str) -> int:
        """How many tokens ``text`` is, without caching it (whole prompts are counted once)."""
        return len(self._encoder.encode_whole(text))

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens included."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @cached_property
    def deltas(self) -> DeltaRenderer:
        """Renders what new messages add to a conversation from a window of it, checked
        against full renders (`agentrl_sdk.chat.delta`); shared by every ledger of the
        template, so its probes run once."""
        return DeltaRenderer(lambda m, t, g: self.render(m, t, add_generation_prompt=g))

    @cached_property
    def special_token_ids(self) -> dict[str, int]:
        """The id of each special token's text (``<|im_end|>``), added tokens included."""
        added = dict(self.tokenizer.get_added_vocab())
        specials = self.tokenizer.all_special_tokens
        ids = self.tokenizer.convert_tokens_to_ids(specials)
        return {**added, **dict(zip(specials, ids, strict=True))}

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
