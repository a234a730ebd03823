"""A supervisor and two workers, three sets of weights: one graph, per-node training.

- ``supervisor`` (policy ``supervisor``, trained): reads the question and routes it by
  writing ``math`` or ``words``; it earns the reward ``routing`` when right, crediting the
  supervisor node only.
- ``math_worker``: LangGraph's prebuilt ReAct agent (`create_react_agent`), unchanged, on the
  arithmetic tools (the tool-selection task); its model calls run in its ``agent`` node, path
  ``math_worker/agent`` (policy ``default``, trained). ``team_reward`` credits it ``answer``
  when the tool is right.
- ``words_worker`` (policy ``words``, frozen): answers word questions; its calls are recorded
  in the trajectory but never trained, and its engine's weights never change.

No node is decorated: ``rollout.nodes`` in ``config.yaml`` gives each node path its policy
(``supervisor``, ``math_worker/*``, ``words_worker``), as it would for prebuilt code you do not
own. Each policy's samples are its own nodes' segments, and each policy's reward is the credit
of its own nodes: the supervisor's advantages come from ``routing`` alone, the math worker's
from ``answer`` alone (there is no shared outcome). Advantages are grouped per (row, policy).
"""

from __future__ import annotations

import random
import warnings
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import create_react_agent

import agentrl_sdk as sdk
from examples.tool_selection.agent import TOOLS, make_rows, right_tool_reward

ROUTER_SYSTEM = "You route questions. Reply with one word: math or words."
ROUTES = ("math", "words")
ROUTING_REWARD = 0.5
_WORDS = ["apple", "river", "cloud", "stone", "green", "music", "table", "light"]


class State(TypedDict):
    messages: Annotated[list, add_messages]
    operands: list[int]
    question: str
    kind: str
    route: str


def router_prompt(question: str) -> list[dict[str, str]]:
    """What the supervisor sees."""
    return [{"role": "system", "content": ROUTER_SYSTEM}, {"role": "user", "content": question}]


async def supervisor(state: State) -> dict:
    """Route the question; a right route earns the node's own reward."""
    reply = await sdk.TokenChatModel().ainvoke(router_prompt(state["question"]))
    words = reply.text.strip().split()
    route = words[0].strip(".").lower() if words else ""
    sdk.emit_reward(ROUTING_REWARD * (route == state["kind"]), name="routing", node="supervisor")
    return {"route": route if route in ROUTES else "none"}


async def words_worker(state: State) -> dict:
    """Answer a word question (served by the frozen ``words`` policy: recorded, never trained)."""
    reply = await sdk.TokenChatModel().ainvoke(
        [{"role": "user", "content": state["question"]}])
    return {"messages": [reply]}


def math_worker() -> Any:
    """LangGraph's prebuilt ReAct agent on the arithmetic tools: a tool call, then the answer."""
    with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.0; still shipped
        warnings.simplefilter("ignore")
        return create_react_agent(sdk.TokenChatModel(), TOOLS, name="math_worker")


def build_graph() -> Any:
    """supervisor -> math_worker (a prebuilt agent) | words_worker -> end."""
    graph = StateGraph(State)
    graph.add_node("supervisor", supervisor)
    graph.add_node("math_worker", math_worker())
    graph.add_node("words_worker", words_worker)
    graph.add_edge(START, "supervisor")
    graph.add_conditional_edges("supervisor", lambda s: s["route"],
                                {"math": "math_worker", "words": "words_worker", "none": END})
    graph.add_edge("math_worker", END)
    graph.add_edge("words_worker", END)
    return graph.compile()


def graph_input(row: dict[str, Any]) -> dict[str, Any]:
    return {"messages": row["messages"], "operands": row["operands"],
            "question": row["question"], "kind": row["kind"], "route": ""}


def make_mixed_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Half arithmetic questions (tool-selection rows), half word questions."""
    rng = random.Random(seed)
    rows = []
    for i, row in enumerate(make_rows(count, seed)):
        if rng.random() < 0.5:
            rows.append({**row, "question": row["messages"][-1]["content"], "kind": "math"})
        else:
            question = f"Spell the word {rng.choice(_WORDS)}."
            rows.append({"id": f"words-{seed}-{i}", "operands": [0, 1], "tool": "",
                         "messages": [{"role": "user", "content": question}],
                         "question": question, "kind": "words"})
    return rows


def training_rows() -> list[dict[str, Any]]:
    return make_mixed_rows(256, seed=2)


def team_reward(
    state: dict[str, Any], row: dict[str, Any], trajectory: Any
) -> list[sdk.RewardComponent]:
    """Each worker's credit for its own work (the supervisor's ``routing`` comes on top).

    ``answer`` credits the math worker: a math question solved with the right tool. ``words``
    credits the frozen words worker (logged, trains nothing): a word question answered.
    """
    if row["kind"] == "math":
        solved = right_tool_reward(state, row, trajectory) if state["route"] == "math" else 0.0
        return [sdk.RewardComponent(name="answer", value=solved, node="math_worker")]
    answered = any(isinstance(m, AIMessage) for m in state["messages"])
    words = float(state["route"] == "words" and answered)
    return [sdk.RewardComponent(name="words", value=words, node="words_worker")]


def routing_demo(row: dict[str, Any], rng: random.Random, accuracy: float) -> list[dict[str, str]]:
    """A supervisor demonstration that routes right with probability ``accuracy``."""
    route = row["kind"] if rng.random() < accuracy else rng.choice(ROUTES)
    return [*router_prompt(row["question"]), {"role": "assistant", "content": route}]
