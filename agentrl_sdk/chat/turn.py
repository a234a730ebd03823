"""One recorded LLM turn, the chat layer's public entry point, and how a failed rollout is named.

`TokenChatModel` (LangChain's interface) and the OpenAI-compatible gateway both call
`record_turn`: messages in, a parsed `AIMessage` out, the call planned, generated and committed
to the rollout's token ledger in between. `failure_status` is the one mapping from what a
rollout raised to its `TrajectoryStatus`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call

from agentrl_sdk.chat.attribution import NodeTag
from agentrl_sdk.chat.messages import to_template_message, with_format_instruction
from agentrl_sdk.chat.recorder import PendingCall, RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.tool_parsers import TOOL_PARSERS, ParsedResponse, ToolParser
from agentrl_sdk.errors import ContextBudgetExceeded, EngineError
from agentrl_sdk.types import GenerateResult, TrajectoryStatus

__all__ = ["DEFAULT_MODEL_NAME", "failure_status", "record_turn", "split_stops"]

DEFAULT_MODEL_NAME = "agentrl-token-model"


async def record_turn(
    recorder: RolloutRecorder,
    node: NodeTag,
    messages: Sequence[BaseMessage],
    *,
    tools: list[dict[str, Any]] | None = None,
    stop: Sequence[str] | None = None,
    sampling: Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    run_id: Any = None,
    model_name: str = DEFAULT_MODEL_NAME,
    timeout_s: float | None = None,
    tool_choice: str | None = None,
) -> AIMessage:
    """Generate one reply to ``messages`` for ``node`` and record it in ``recorder``'s ledger.

    Args:
        node: Which node (and policy) the call belongs to, and whether it trains.
        tools: OpenAI tool schemas the template renders into the prompt.
        stop: Stop strings, any text: the engine stops once the generated text contains one,
            and the reply's text is cut there (the ledger keeps every sampled id).
        sampling: Overrides of the rollout's sampling parameters (temperature, max_tokens...).
        response_format: An OpenAI ``response_format``; shown to the model as an instruction.
        run_id: The LangChain run of the call, kept on the ledger entry for its trace.
        model_name: Reported in the reply's ``response_metadata``.
        timeout_s: Longest wait for the engine; None keeps the recorder's
            ``chat.request_timeout_s``.
        tool_choice: As `checked_tool_choice` returns it; recorded in the reply's
            ``response_metadata``. ``none`` leaves the tools out of the prompt; ``required``
            or a tool's name forces a call: the reply opens with the tool-call format's
            opening (and the tool's name), written by the SDK, not sampled, so the ledger
            keeps those tokens at mask 0 (`LLMCall.forced_ids`).

    Returns:
        The reply, parsed from the generated ids (content and tool calls).

    Raises:
        ValueError: A stop string is empty, or the engine cannot read stop strings.
        ContextBudgetExceeded: The prompt leaves no room for one generated token.
        EngineError: The engine failed or did not answer in time.
    """
    dicts = [to_template_message(m, recorder.clip_observation) for m in messages]
    if response_format:
        dicts = with_format_instruction(dicts, dict(response_format))
    overrides = dict(sampling or {})
    texts: tuple[str, ...] = ()
    if stop:
        ids, texts = split_stops(recorder.template, stop)
        overrides["stop_token_ids"] = (*overrides.get("stop_token_ids", ()), *ids)
        overrides["stop"] = texts
    if tool_choice == "none":
        tools = None
    parser = TOOL_PARSERS[recorder.chat.tool_parser]()
    opening = _forced_opening(parser, tools, tool_choice)
    pending = await recorder.generate(
        dicts, tools, node, overrides, timeout_s=timeout_s,
        forced_ids=recorder.template.encode(opening) if opening else None,
    )
    message = _reply(recorder, parser, pending, model_name, texts)
    if tool_choice is not None:
        message.response_metadata["tool_choice"] = tool_choice
    recorder.commit(pending, to_template_message(message), run_id)
    return message


def split_stops(
    template: ChatTemplate, stop: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``stop`` as the token ids of the special tokens among it, and the other strings.

    A special token (``<|im_end|>``) stops as its id, which every engine reads without a
    tokenizer; any other text stops as a string, whatever tokens spell it.

    Raises:
        ValueError: A stop string is empty.
    """
    if any(not text for text in stop):
        raise ValueError(f"stop strings must be non-empty, got {list(stop)!r}")
    specials = template.special_token_ids
    ids = tuple(specials[t] for t in stop if t in specials)
    return ids, tuple(t for t in stop if t not in specials)


def failure_status(exc: BaseException, timeout_s: float | None = None) -> tuple[TrajectoryStatus, str]:
    """The status and error text of a rollout that raised ``exc``.

    ``timeout_s`` names the rollout's limit when ``exc`` is its timeout.
    """
    if isinstance(exc, ContextBudgetExceeded):
        return "context_exceeded", str(exc)
    if isinstance(exc, EngineError):
        return "engine_error", str(exc)
    if isinstance(exc, TimeoutError):
        return "timeout", f"rollout exceeded timeout_s={timeout_s}"
    if isinstance(exc, RecursionError):  # LangGraph's GraphRecursionError is one
        return "graph_error", f"recursion limit reached: {exc}"
    return "graph_error", f"{type(exc).__name__}: {exc}"


def _forced_opening(
    parser: ToolParser, tools: list[dict[str, Any]] | None, tool_choice: str | None
) -> str:
    """The reply opening that forces the call ``tool_choice`` asks for ("" when it asks none)."""
    if not tools or tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice == "required":  # a call is required: to the only tool, if there is one
        tool_choice = tools[0]["function"]["name"] if len(tools) == 1 else None
    return parser.call_prefix(tool_choice)


def _reply(
    recorder: RolloutRecorder, parser: ToolParser, pending: PendingCall, model_name: str,
    stops: Sequence[str] = (),
) -> AIMessage:
    """The AIMessage the caller sees: parsed from the reply's ids, for control flow only."""
    result, forced = pending.result, pending.plan.forced_ids
    parsed: ParsedResponse = parser.parse(_reply_text(recorder.template, forced, result, stops))
    recorder.metrics["tool_calls"] += len(parsed.tool_calls)
    recorder.metrics["malformed_tool_calls"] += len(parsed.invalid_tool_calls)
    if forced:
        recorder.metrics["forced_tool_calls"] += 1
    prompt_len = len(pending.plan.engine_prompt)
    return AIMessage(
        content=parsed.content,
        tool_calls=[tool_call(name=c.name, args=c.args, id=_call_id()) for c in parsed.tool_calls],
        invalid_tool_calls=[
            invalid_tool_call(name=c.name, args=c.args, id=_call_id(), error=c.error)
            for c in parsed.invalid_tool_calls
        ],
        response_metadata={
            "model_name": model_name,
            "finish_reason": result.finish_reason,
            "policy_version": result.policy_version,
            "request_id": pending.request_id,
            "segment_started": pending.plan.start_reason,
            **({"forced_opening": recorder.template.decode(forced)} if forced else {}),
        },
        usage_metadata={
            "input_tokens": prompt_len,
            "output_tokens": len(result.token_ids),
            "total_tokens": prompt_len + len(result.token_ids),
        },
    )


def _reply_text(
    template: ChatTemplate, forced: list[int], result: GenerateResult, stops: Sequence[str]
) -> str:
    """The reply's text (a forced opening, then the generated text) up to the first stop
    string in the generated part (as LangChain and OpenAI cut it), else without the final
    stop/end-of-turn token of a stopped response."""
    text = template.decode([*forced, *result.token_ids])
    generated_from = len(template.decode(forced)) if forced else 0
    cut = min((i for i in (text.find(s, generated_from) for s in stops) if i >= 0), default=None)
    if cut is not None:
        return text[:cut]
    if result.finish_reason == "stop" and result.token_ids:
        # The end-of-turn token is not content.
        return template.decode([*forced, *result.token_ids[:-1]])
    return text


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
