"""LangChain's standard unit tests for chat models, run on TokenChatModel.

Capabilities are declared as they are, not as the suite would like: tools and structured
output work (tool calls parsed from the generated text); a required or named ``tool_choice``
is enforced by forcing the call's opening tokens (mask 0); the model reads text only (no image, audio, video or PDF blocks).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from agentrl_sdk import TokenChatModel
from agentrl_sdk.models.tokenizers import build_qwen_tokenizer
from tests.chat._rule_engine import RuleEngine


@cache
def _tokenizer() -> Any:
    return build_qwen_tokenizer("hermes")


class _Capabilities:
    """What TokenChatModel can do, declared once for both suites."""

    @property
    def chat_model_class(self) -> type[TokenChatModel]:
        return TokenChatModel

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True  # required / a named tool: the reply opens with the call, forced

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestTokenChatModelStandard(_Capabilities, ChatModelUnitTests):
    """The suite's checks of construction, tracing parameters, tool binding and schemas."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"tokenizer": _tokenizer()}


class TestTokenChatModelIntegration(_Capabilities, ChatModelIntegrationTests):
    """The suite's end-to-end checks, answered by a rule-following engine (`RuleEngine`):
    everything between the prompt ids and the parsed reply is the real chat layer."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"tokenizer": _tokenizer(), "engine": RuleEngine(_tokenizer())}
