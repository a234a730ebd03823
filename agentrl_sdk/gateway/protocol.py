"""The OpenAI chat-completions wire format the gateway speaks, as pydantic models.

Only what the gateway reads or writes is modelled; unknown request fields are accepted and
ignored (clients such as LiteLLM send many), so a request fails only on what it gets wrong.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "developer", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    """A tool call's function: its name and its arguments as a JSON-object string."""

    name: str = Field(min_length=1)
    arguments: str = "{}"

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"function.arguments is not valid JSON: {exc.msg}") from None
        if not isinstance(parsed, dict):
            raise ValueError("function.arguments must encode a JSON object")
        return value


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """A content block; only text blocks reach the chat template."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One message of the conversation, as OpenAI clients send it."""

    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The message as the plain dict LangChain's ``convert_to_messages`` reads."""
        out = self.model_dump(exclude_none=True, include={
            "role", "content", "name", "tool_calls", "tool_call_id",
        })
        out.setdefault("content", "")  # an assistant message with only tool calls
        return out


class FunctionSpec(BaseModel):
    """A tool's schema."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSpec(BaseModel):
    """A tool offered to the model."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming one function."""

    type: Literal["function"] = "function"
    function: dict[str, str]


class StreamOptions(BaseModel):
    """``stream_options``: whether the last chunk carries usage."""

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """A ``POST /v1/chat/completions`` body."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.get("name")
            known = {t.function.name for t in self.tools or []}
            if name not in known:
                raise ValueError(f"tool_choice names {name!r}, which is not in tools")
        return self


class Usage(BaseModel):
    """Token counts of a completion (all ``n`` choices)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(BaseModel):
    """The assistant message of one choice."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class Choice(BaseModel):
    """One of the ``n`` answers."""

    index: int
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    """A non-streaming response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ErrorBody(BaseModel):
    """The ``error`` object of an OpenAI error response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """An OpenAI-style error: ``{"error": {...}}``."""

    error: ErrorBody


class RewardRequest(BaseModel):
    """A ``POST /rollouts/{id}/reward`` body: one reward component of the rollout."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(allow_inf_nan=False)
    name: str = Field("reward", min_length=1)
    node: str | None = Field(
        None, description="The node credited (e.g. the gateway's node name); None: shared."
    )
    step: int | None = Field(None, ge=0, description="The node's LLM call credited.")


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models``."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "agentrl"
