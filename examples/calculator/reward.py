"""The calculator agent's reward: partial credit for each correct step, most for the answer."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage


def calculator_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> dict[str, float]:
    """Components: the first call computes a+b (0.25), the second (a+b)*c (0.25), answer (0.5)."""
    a, b, c = row["operands"]
    messages = state["messages"]
    calls = [call for m in messages if isinstance(m, AIMessage) for call in m.tool_calls]
    expressions = [str(call["args"].get("expression", "")).replace(" ", "") for call in calls]
    final = messages[-1].content if isinstance(messages[-1], AIMessage) else ""
    return {
        "first_call": 0.25 * (len(expressions) > 0 and expressions[0] == f"{a}+{b}"),
        "second_call": 0.25 * (len(expressions) > 1 and expressions[1] == f"{a + b}*{c}"),
        "answer": 0.5 * (final == f"The answer is {row['answer']}."),
    }
