"""The calculator task as a plain OpenAI-SDK tool loop: no LangChain, no LangGraph.

`agent(endpoint, row)` is what ``sdk.train`` calls: the endpoint's base URL is private to the
rollout, so the gateway records every call into that rollout's token ledger.
"""

from __future__ import annotations

import json
from typing import Any

import agentrl_sdk as sdk
from agentrl_sdk.chat.messages import to_openai_tools
from examples.calculator.agent import calculator
from examples.calculator.calculator import calculate

TOOLS = to_openai_tools([calculator])
MAX_TURNS = 6


async def calculator_agent(client: Any, row: dict[str, Any], *, model: str = "agentrl",
                           stream: bool = False) -> list[dict[str, Any]]:
    """Ask, run the calculator calls the model makes, send the results back; repeat.

    Returns:
        The whole conversation as OpenAI message dicts.
    """
    messages: list[dict[str, Any]] = list(row["messages"])
    for _ in range(MAX_TURNS):
        if stream:
            message = await _streamed(client, model, messages)
        else:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, tool_choice="auto"
            )
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": _run_tool(call["function"])})
    return messages


def _run_tool(function: dict[str, Any]) -> str:
    try:
        value = calculate(json.loads(function["arguments"])["expression"])
    except Exception as exc:  # noqa: BLE001 - the model sees the error, as with sdk.ToolNode
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


async def _streamed(client: Any, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed answer, reassembled into the message a non-streamed call returns."""
    stream = await client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, stream=True
    )
    content, calls = "", []
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            calls.append({"id": call.id, "type": "function",
                          "function": {"name": call.function.name,
                                       "arguments": call.function.arguments}})
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message


async def agent(endpoint: sdk.AgentEndpoint, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent function ``sdk.train`` runs: its conversation is the reward's final state."""
    client = endpoint.client(max_retries=0, timeout=120)
    return await calculator_agent(client, row, model=endpoint.model)


def reward(conversation: list[dict[str, Any]], row: dict[str, Any], trajectory: Any) -> dict:
    """The calculator reward, read from OpenAI messages: each right step, most for the answer."""
    a, b, c = row["operands"]
    calls = [json.loads(call["function"]["arguments"]).get("expression", "")
             for m in conversation for call in m.get("tool_calls") or []]
    calls = [str(e).replace(" ", "") for e in calls]
    final = conversation[-1].get("content") if conversation[-1]["role"] == "assistant" else ""
    return {
        "first_call": 0.25 * (len(calls) > 0 and calls[0] == f"{a}+{b}"),
        "second_call": 0.25 * (len(calls) > 1 and calls[1] == f"{a + b}*{c}"),
        "answer": 0.5 * (final == f"The answer is {row['answer']}."),
    }
