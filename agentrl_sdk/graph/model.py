"""`chat_model()`: the token chat model a node uses, bound to the running rollout."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from agentrl_sdk.chat.model import TokenChatModel


def chat_model(config: RunnableConfig | None = None, **sampling: Any) -> TokenChatModel:
    """The chat model for a node: engine, tokenizer and ledger come from the rollout.

    Args:
        config: The node's ``RunnableConfig``; ``configurable["agentrl_sampling"]`` (a dict)
            overrides sampling for this graph run.
        **sampling: Per-node sampling overrides (``temperature``, ``max_tokens``, ...).
    """
    configured = ((config or {}).get("configurable") or {}).get("agentrl_sampling") or {}
    return TokenChatModel(**{**configured, **sampling})
