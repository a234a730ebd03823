"""`TokenChatModel`: a LangChain chat model that talks token ids to the engine and records them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers import (
    BaseOutputParser,
    JsonOutputParser,
    PydanticOutputParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.tracers._streaming import _StreamingCallbackHandler  # LangChain's test
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass
from langchain_core.utils.utils import LC_ID_PREFIX
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr

from agentrl_sdk.chat.attribution import graph_path
from agentrl_sdk.chat.context import current_node, current_recorder
from agentrl_sdk.chat.messages import (
    checked_tool_choice,
    to_openai_tools,
    to_template_message,
)
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.turn import DEFAULT_MODEL_NAME, record_turn
from agentrl_sdk.config import ChatConfig
from agentrl_sdk.errors import EngineError, NoEngineError

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed")
# What a call may carry besides ``stop``: bound by `bind`/`bind_tools` or passed to `invoke`.
_CALL_ARGUMENTS = frozenset({"tools", "tool_choice", "response_format", *_SAMPLING_FIELDS})


class TokenChatModel(BaseChatModel):
    """A chat model whose every call is token-exact and recorded in the rollout's ledger.

    Inside a rollout (``sdk.rollout`` / ``sdk.train``) the engine, tokenizer and limits come
    from the rollout, and every call lands in its token ledger. Outside a rollout it needs
    its own ``engine`` and ``tokenizer`` and behaves like any chat model.

    Sampling fields left as None use the rollout's sampling configuration; the same names
    passed to a call (``invoke(x, temperature=0)``, ``bind(max_tokens=3)``) override them for
    that call. Unknown constructor fields and call arguments are refused, naming the field,
    rather than silently ignored.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    engine: Any = Field(None, description="Engine used outside rollouts (an `Engine`).")
    tokenizer: Any = Field(None, description="Tokenizer with a chat template, outside rollouts.")
    chat: ChatConfig = Field(default_factory=ChatConfig, description="Limits outside rollouts.")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] | None = Field(
        None, description="Stop strings of every call; a call's own ``stop`` replaces them."
    )
    timeout: float | None = Field(
        None, gt=0, description="Seconds to wait for the engine per call; None keeps "
        "the rollout's (or ``chat``'s) ``request_timeout_s``."
    )
    max_retries: int = Field(
        0, ge=0, description="Times a call is sent again after an `EngineError` (a failed or "
        "timed-out engine call; nothing of it reached the ledger) before the error is raised."
    )
    streaming: bool = Field(
        False, description="LangChain's streaming switch: callbacks see each reply as one new "
        "token (engines return whole replies); a graph streamed with stream_mode='messages' or "
        "astream_events(version='v2') gets that chunk without it. Recorded the same either way."
    )
    model_name: str = DEFAULT_MODEL_NAME
    api_key: SecretStr | None = Field(
        None, description="Accepted as LangChain's standard parameter (`init_chat_model`, "
        "langchain-tests); the engine is local, so it is ignored."
    )
    _template: ChatTemplate | None = PrivateAttr(None)

    def __repr_args__(self) -> Any:
        # LangChain puts repr(model) into the serialized form of every run it starts, and
        # its default compares each of ~15 fields against its default (~0.3 ms per call).
        return [(name, getattr(self, name)) for name in sorted(self.model_fields_set)]

    @property
    def _llm_type(self) -> str:
        return "agentrl-token"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, **self._overrides()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """Tracing parameters: provider ``agentrl``, and the constructor's stop strings."""
        params = super()._get_ls_params(stop=stop if stop is not None else self.stop, **kwargs)
        params["ls_provider"] = "agentrl"
        return params

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; they are rendered by the chat template into every prompt.

        ``tool_choice`` is checked (``auto``, ``none``, ``required``/``any``/``True`` or a
        bound tool's name, as a string or OpenAI's dict) and recorded in each reply's
        ``response_metadata``. ``none`` leaves the tools out of the prompt. ``required`` and a
        named tool force a call: each reply opens with the tool-call format's opening (and
        the tool's name), which the SDK writes and the model continues. Those tokens were not
        sampled, so they are trained at mask 0 (`LLMCall.forced_ids`,
        ``response_metadata["forced_opening"]``).

        Raises:
            ValueError: ``tool_choice`` is not one of these, or names a tool not bound.
        """
        schemas = to_openai_tools(tools)
        choice = checked_tool_choice(tool_choice, schemas)
        return super().bind(tools=schemas, tool_choice=choice, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        streamed = bool(kwargs.pop("stream", False)) or self.streaming or _streamed_to(run_manager)
        sampling = self._call_sampling(kwargs)
        recorder = current_recorder.get() or self._standalone_recorder()
        metadata = getattr(run_manager, "metadata", None)
        node = current_node.get() or recorder.node_at(graph_path(metadata))
        choice = checked_tool_choice(kwargs.get("tool_choice"), kwargs.get("tools"))
        for attempt in range(self.max_retries + 1):
            try:
                message = await record_turn(
                    recorder, node, messages, tools=kwargs.get("tools"),
                    stop=self.stop if stop is None else stop, sampling=sampling,
                    response_format=kwargs.get("response_format"),
                    run_id=run_manager.run_id if run_manager else None,
                    model_name=self.model_name, timeout_s=self.timeout, tool_choice=choice,
                )  # fmt: skip
            except EngineError:
                if attempt == self.max_retries:
                    raise
                recorder.metrics["engine_retries"] += 1
            else:
                break
        if run_manager:
            message.id = f"{LC_ID_PREFIX}-{run_manager.run_id}-0"  # the id LangChain gives it
            if streamed:  # the whole reply is the one token a streaming callback sees
                chunk = ChatGenerationChunk(message=_as_chunk(message))
                sent = run_manager.on_llm_new_token(str(message.content), chunk=chunk)
                if inspect.isawaitable(sent):
                    await sent
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        coro = self._agenerate(messages, stop, run_manager, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        # Called synchronously from inside an event loop: run on a helper thread (with the
        # caller's context variables), not nested.
        ctx = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(ctx.run, asyncio.run, coro).result()

    def _should_stream(self, *, async_api: bool, **kwargs: Any) -> bool:
        # LangChain's invoke-through-stream path calls `_astream` without the run, and the run
        # carries the graph node the call belongs to: invoke always generates whole replies.
        return False

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The reply as one chunk (LangChain's event streaming, ``stream_events(version="v3")``)."""
        result = await self._agenerate(messages, stop, run_manager, **kwargs)
        yield ChatGenerationChunk(message=_as_chunk(result.generations[0].message))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        result = self._generate(messages, stop, run_manager, **kwargs)
        yield ChatGenerationChunk(message=_as_chunk(result.generations[0].message))

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """The reply as one chunk, once the engine has answered (engines return whole replies).

        The call runs as `ainvoke` runs it, so it is attributed to its graph node and linked
        in the trace (LangChain's own streaming path gives the model no run to read the node
        from); streaming callbacks see the reply as one new token.
        """
        yield _as_chunk(await self.ainvoke(input, config, stop=stop, stream=True, **kwargs))

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """Synchronous `astream`."""
        yield _as_chunk(self.invoke(input, config, stop=stop, stream=True, **kwargs))

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["function_calling", "json_mode", "json_schema"] = "function_calling",
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """Structured output through a tool call (default) or as JSON in the reply's text.

        ``json_mode`` / ``json_schema`` parse the reply's text as JSON (into ``schema`` when it
        is a pydantic class; a dict for a TypedDict or a JSON schema); the schema is shown to the model as a system instruction when
        given. Nothing constrains decoding: a reply that is not valid JSON raises (or, with
        ``include_raw``, comes back as ``parsing_error`` beside the raw message). Either way the
        call is recorded token by token like any other.
        """
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        if method not in ("json_mode", "json_schema"):
            raise ValueError(f"unknown structured output method {method!r}")
        if method == "json_schema" and schema is None:
            raise ValueError("method='json_schema' needs a schema")
        parser: BaseOutputParser[Any] = (
            PydanticOutputParser(pydantic_object=schema)
            if isinstance(schema, type) and is_basemodel_subclass(schema)
            else JsonOutputParser()
        )
        llm = self.bind(
            response_format={"type": "json_object"} if schema is None else {
                "type": "json_schema", "schema": convert_to_json_schema(schema)},
            # What LangChain's own paths give callbacks (LangSmith shows the schema).
            ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
        )  # fmt: skip
        if not include_raw:
            return llm | parser

        def parse(raw: AIMessage) -> dict[str, Any]:
            try:
                return {"raw": raw, "parsed": parser.invoke(raw), "parsing_error": None}
            except Exception as exc:  # noqa: BLE001 - returned to the caller, as LangChain does
                return {"raw": raw, "parsed": None, "parsing_error": exc}

        return llm | RunnableLambda(parse)

    def get_token_ids(self, text: str) -> list[int]:
        """Ids of ``text`` under the model's own tokenizer (the rollout's, inside a rollout).

        LangChain's default is GPT-2's tokenizer, which counts another model's tokens (and
        nothing at all offline).
        """
        return self._chat_template().encode(text)

    def get_num_tokens_from_messages(
        self,
        messages: list[BaseMessage],
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
    ) -> int:
        """Tokens ``messages`` (and ``tools``) take once rendered by the model's chat template.

        Counted as the engine would see them, without the generation prompt, so
        ``trim_messages(..., token_counter=model)`` trims by the model's own context. Inside a
        rollout the rollout's template is used and tool outputs are clipped as its calls clip
        them. A template that adds a default system prompt to a conversation without one
        (Qwen's) counts it too, so counts of parts can sum to more than the whole:
        ``trim_messages`` then trims conservatively, never past the budget.
        """
        if not messages:
            return 0
        recorder = current_recorder.get()
        template = self._chat_template()
        clip = recorder.clip_observation if recorder is not None else None
        dicts = [to_template_message(m, clip) for m in messages]
        openai_tools = to_openai_tools(tools) if tools else None
        return template.count(template.render(dicts, openai_tools, add_generation_prompt=False))

    def _call_sampling(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's sampling overrides: the instance's fields, then the call's arguments.

        Raises:
            TypeError: The call carries an argument this model does not know.
        """
        if unknown := sorted(set(kwargs) - _CALL_ARGUMENTS):
            raise TypeError(
                f"TokenChatModel does not support the call argument(s) {unknown}; it takes "
                f"stop and {sorted(_CALL_ARGUMENTS)}"
            )
        call = {k: kwargs[k] for k in _SAMPLING_FIELDS if kwargs.get(k) is not None}
        return {**self._overrides(), **call}

    def _overrides(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SAMPLING_FIELDS if getattr(self, k) is not None}

    def _chat_template(self) -> ChatTemplate:
        """The rollout's template inside a rollout, else one built from ``tokenizer``."""
        if (recorder := current_recorder.get()) is not None:
            return recorder.template
        if self.tokenizer is None:
            raise NoEngineError(
                "TokenChatModel has no tokenizer outside a rollout: run it inside "
                "sdk.rollout(...) or pass tokenizer="
            )
        # One template per model: it compiles the Jinja once and keeps the encode cache warm.
        template = self._template
        if (template is None or template.tokenizer is not self.tokenizer
                or template.tool_prompt_setting != self.chat.tool_prompt):
            self._template = template = ChatTemplate(self.tokenizer, self.chat.tool_prompt)
        return template

    def _standalone_recorder(self) -> RolloutRecorder:
        if self.engine is None or self.tokenizer is None:
            raise NoEngineError(
                "TokenChatModel was called outside a rollout without an engine and tokenizer: "
                "run the graph with sdk.rollout(...) or pass engine= and tokenizer="
            )
        return RolloutRecorder(
            self.engine, self._chat_template(), chat=self.chat,
            rollout_id=f"call-{uuid.uuid4().hex[:12]}",
        )


# LangChain asks `inspect.signature` whether `_agenerate` takes a run manager on every call
# (~10 us); a signature stored on the function is read from it instead of rebuilt.
TokenChatModel._agenerate.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    TokenChatModel._agenerate
)


def _streamed_to(run_manager: Any) -> bool:
    """Whether a streaming consumer listens to this call (``astream_events``, LangGraph's
    ``stream_mode="messages"``): LangChain would stream to it, so it gets the reply as one
    new token, as `astream` gives it."""
    handlers = getattr(run_manager, "handlers", None) or ()
    return any(isinstance(h, _StreamingCallbackHandler) for h in handlers)


def _as_chunk(message: AIMessage) -> AIMessageChunk:
    """A whole reply as the last streaming chunk (tool calls as complete tool-call chunks)."""
    chunks = [
        tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
        for i, c in enumerate(message.tool_calls)
    ]
    return AIMessageChunk(
        content=message.content, tool_call_chunks=chunks,
        invalid_tool_calls=message.invalid_tool_calls, id=message.id,
        response_metadata=message.response_metadata, usage_metadata=message.usage_metadata,
        chunk_position="last",
    )
