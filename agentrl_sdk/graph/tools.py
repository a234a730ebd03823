"""`ToolNode` and `tools_condition` that send malformed calls and tool errors back to the model.

LangGraph's prebuilt pair ignores ``invalid_tool_calls`` (the graph ends on a malformed call)
and re-raises tool exceptions. For RL the model should see its mistake and the rollout go on,
with the error counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException
from langgraph.prebuilt import ToolNode as _LangGraphToolNode
from langgraph.runtime import Runtime

from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.threads import UserCodeExecutor


class ToolNode(_LangGraphToolNode):
    """LangGraph's ToolNode that also answers malformed calls and catches every tool error.

    Each malformed call gets an error ``ToolMessage`` naming what was wrong; tool exceptions
    become error messages (``handle_tool_errors=True`` by default). Both are counted in the
    rollout's metrics (``tool_errors``). With ``timeout_s``, a function tool (``@tool`` /
    ``StructuredTool``) that runs longer becomes an error message too (counted as
    ``tool_timeouts``); `agentrl_sdk.RLTool` has its own ``timeout_s``. Parallel calls of one
    AI message run concurrently under ``ainvoke``.

    Synchronous function tools run on the node's own ``threads`` (not the event loop's
    default executor, where LangGraph runs the graph's sync nodes and edges): a tool stuck
    for good holds one of them and the rest of the graph, and other rollouts, go on.
    """

    def __init__(
        self,
        tools: Sequence[Any],
        *,
        handle_tool_errors: Any = True,
        timeout_s: float | None = None,
        threads: int = 16,
        **kwargs: Any,
    ):
        pool = UserCodeExecutor(threads, thread_name_prefix="agentrl-toolnode")
        tools = [_on_own_threads(t, pool, timeout_s) for t in tools]
        super().__init__(tools, handle_tool_errors=handle_tool_errors, **kwargs)

    # LangGraph injects config/runtime by annotation: keep the parent's exact types.
    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        ai = _last_ai(input, self._messages_key)
        output = super()._func(input, config, runtime) if ai and ai.tool_calls else None
        return self._finish(input, ai, output)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        ai = _last_ai(input, self._messages_key)
        output = await super()._afunc(input, config, runtime) if ai and ai.tool_calls else None
        return self._finish(input, ai, output)

    def _finish(self, input: Any, ai: AIMessage | None, output: Any) -> Any:
        errors = [_malformed_reply(c) for c in (ai.invalid_tool_calls if ai else [])]
        if output is None:
            output = errors if isinstance(input, list) else {self._messages_key: errors}
        elif isinstance(output, dict):
            output = {**output, self._messages_key: [*output[self._messages_key], *errors]}
        elif isinstance(output, list):
            output = [*output, *errors]
        _count_errors(output, self._messages_key)
        return output


def tools_condition(
    state: list[AnyMessage] | dict[str, Any] | Any, messages_key: str = "messages"
) -> Literal["tools", "__end__"]:
    """Route to ``"tools"`` when the last AI message has tool calls, malformed ones included."""
    ai = _last_ai(state, messages_key)
    if ai is not None and (ai.tool_calls or ai.invalid_tool_calls):
        return "tools"
    return "__end__"


def _last_ai(state: Any, key: str) -> AIMessage | None:
    if isinstance(state, list):
        messages = state
    elif isinstance(state, dict):
        messages = state.get(key, [])
    else:
        messages = getattr(state, key, [])
    last = messages[-1] if messages else None
    return last if isinstance(last, AIMessage) else None


def _malformed_reply(call: dict[str, Any]) -> ToolMessage:
    return ToolMessage(
        content=f"Error: malformed tool call: {call.get('error')}. Write the call as "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call> with valid JSON.',
        tool_call_id=call.get("id") or "invalid",
        name=call.get("name") or "unknown",
        status="error",
    )


def _on_own_threads(tool: Any, pool: UserCodeExecutor, timeout_s: float | None) -> Any:
    """A copy of a function tool whose sync function runs on ``pool`` and whose calls fail
    with `ToolException` after ``timeout_s`` (the thread of a stuck sync call stays busy, as
    Python threads cannot be killed, but the rollout moves on)."""
    if not isinstance(tool, StructuredTool) or (tool.coroutine is not None and timeout_s is None):
        return tool
    original = tool.coroutine
    function = tool.func

    async def limited(*args: Any, **kwargs: Any) -> Any:
        if original is not None:
            call = original(*args, **kwargs)
        else:
            run = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
            call = asyncio.get_running_loop().run_in_executor(pool, run)
        try:
            return await asyncio.wait_for(call, timeout=timeout_s)
        except TimeoutError:
            if (recorder := current_recorder.get()) is not None:
                recorder.metrics["tool_timeouts"] += 1
            raise ToolException(f"tool {tool.name!r} timed out after {timeout_s} s") from None

    limited = functools.wraps(original or function)(limited)
    return tool.model_copy(update={"coroutine": limited})


def _count_errors(output: Any, key: str) -> None:
    recorder = current_recorder.get()
    if recorder is None:
        return
    messages = output.get(key, []) if isinstance(output, dict) else output
    errors = sum(isinstance(m, ToolMessage) and m.status == "error" for m in messages)
    recorder.metrics["tool_errors"] += errors
