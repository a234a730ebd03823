"""One chat completion: OpenAI messages in, recorded `TokenChatModel` calls, OpenAI choices out.

The gateway does not template, tokenize or parse on its own: it converts the request into
LangChain messages and records each choice with the chat layer's `record_turn`, as
`TokenChatModel` does, so a call through the gateway lands in the token ledger exactly as a
call from a LangGraph node.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages

from agentrl_sdk.chat.attribution import NodeTag
from agentrl_sdk.chat.turn import failure_status, record_turn, split_stops
from agentrl_sdk.errors import ContextBudgetExceeded, EngineError
from agentrl_sdk.gateway.errors import GatewayError
from agentrl_sdk.gateway.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    FunctionCall,
    NamedToolChoice,
    ResponseMessage,
    ToolCall,
    Usage,
)
from agentrl_sdk.gateway.sessions import RolloutSession


async def complete(
    session: RolloutSession, request: ChatCompletionRequest, *, policy: str, node: str
) -> ChatCompletion:
    """Answer ``request`` for the rollout ``session`` with ``request.n`` recorded calls.

    Raises:
        GatewayError: 400 for messages that cannot be read, an empty ``stop`` string or a
            prompt past the context budget; 503 when the engine fails or times out. Stop
            strings of any length pass through to the engine.
    """
    messages = _messages(request)
    stop = [request.stop] if isinstance(request.stop, str) else request.stop
    try:
        split_stops(session.recorder.template, stop or [])
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="stop") from exc
    sampling = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_completion_tokens or request.max_tokens,
        "seed": request.seed,
    }
    sampling = {k: v for k, v in sampling.items() if v is not None}
    # ``tool_choice`` is checked by the protocol; as in TokenChatModel, ``none`` leaves the tools
    # out of the prompt and a required or named choice is not enforced (decoding is free).
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
    choice = request.tool_choice
    tool_choice = choice.function.get("name") if isinstance(choice, NamedToolChoice) else choice
    node_tag = NodeTag(name=node, policy=policy, trained=True)

    async def generate() -> AIMessage:
        start_ns = time.time_ns()
        reply = await record_turn(session.recorder, node_tag, messages, tools=tools, stop=stop,
                                  sampling=sampling, model_name=request.model,
                                  tool_choice=tool_choice)
        session.record_llm_event(reply.response_metadata["request_id"], start_ns)
        return reply

    try:
        replies = await asyncio.gather(*(generate() for _ in range(request.n)))
    except ValueError as exc:  # a request the engine refuses (stop strings it cannot read)
        raise GatewayError(400, str(exc)) from exc
    except (ContextBudgetExceeded, EngineError) as exc:
        session.fail(*failure_status(exc))
        if isinstance(exc, ContextBudgetExceeded):
            raise GatewayError(
                400, str(exc), code="context_length_exceeded", param="messages"
            ) from exc
        raise GatewayError(503, str(exc), type="server_error", code="engine_error") from exc
    return _completion(request.model, replies)


def _messages(request: ChatCompletionRequest) -> list[BaseMessage]:
    try:
        return convert_to_messages([m.as_dict() for m in request.messages])
    except (ValueError, TypeError, KeyError) as exc:
        raise GatewayError(400, f"messages cannot be read: {exc}", param="messages") from exc


def _completion(model: str, replies: list[AIMessage]) -> ChatCompletion:
    choices = [Choice(index=i, **_choice(reply)) for i, reply in enumerate(replies)]
    prompt = replies[0].usage_metadata["input_tokens"] if replies else 0
    generated = sum(r.usage_metadata["output_tokens"] for r in replies)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=Usage(prompt_tokens=prompt, completion_tokens=generated,
                    total_tokens=prompt + generated),
    )


def _choice(reply: AIMessage) -> dict[str, Any]:
    """The OpenAI message of one reply. Sending it back unchanged next turn extends the ledger:
    it converts to the very message dict the ledger committed."""
    calls = [
        ToolCall(id=c["id"], function=FunctionCall(name=c["name"], arguments=json.dumps(c["args"])))
        for c in reply.tool_calls
    ]
    content = reply.content if isinstance(reply.content, str) else str(reply.content)
    finished = reply.response_metadata.get("finish_reason")
    reason = "length" if finished == "length" else "tool_calls" if calls else "stop"
    message = ResponseMessage(content=content if content or not calls else None,
                              tool_calls=calls or None)
    return {"message": message, "finish_reason": reason}


def stream_chunks(completion: ChatCompletion, *, include_usage: bool) -> Iterator[str]:
    """A finished completion as OpenAI's server-sent events, ending with ``[DONE]``.

    Engines answer a request whole, so the stream carries each choice as a role delta, a
    content delta, a tool-calls delta and a finish delta; clients that stream get the same
    message as clients that do not.
    """
    head = {"id": completion.id, "object": "chat.completion.chunk",
            "created": completion.created, "model": completion.model}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    for choice in completion.choices:
        i, message = choice.index, choice.message
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
        if message.content:
            yield event([{"index": i, "delta": {"content": message.content},
                          "finish_reason": None}])
        if message.tool_calls:
            calls = [{"index": k, **c.model_dump()} for k, c in enumerate(message.tool_calls)]
            yield event([{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}])
        yield event([{"index": i, "delta": {}, "finish_reason": choice.finish_reason}])
    if include_usage:
        yield event([], usage=completion.usage.model_dump())
    yield "data: [DONE]\n\n"
