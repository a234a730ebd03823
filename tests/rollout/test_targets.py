"""A target that cannot run is refused before any engine starts, saying what to pass."""

from __future__ import annotations

import pytest
from langgraph.graph import START, MessagesState, StateGraph

import agentrl_sdk as sdk


def _builder() -> StateGraph:
    builder = StateGraph(MessagesState)
    builder.add_node("echo", lambda state: {"messages": []})
    builder.add_edge(START, "echo")
    return builder


def test_an_uncompiled_graph_is_refused_by_train_evaluate_and_arollout() -> None:
    rows = [{"messages": [{"role": "user", "content": "hi"}]}]
    message = r"is a StateGraph builder, not a compiled graph: pass graph.compile\(\)"
    with pytest.raises(TypeError, match=message):
        sdk.train(_builder(), rows, lambda *_: 0.0, {"model": {"path": "nowhere"}})
    with pytest.raises(TypeError, match=message):
        sdk.evaluate(_builder(), rows, lambda *_: 0.0, {"model": {"path": "nowhere"}})
    with pytest.raises(TypeError, match=message):
        sdk.rollout(_builder(), rows[0], object(), tokenizer=None)


def test_a_mapping_names_the_agent_whose_target_is_wrong() -> None:
    graphs = {"default": _builder().compile(), "coder": 42}
    with pytest.raises(TypeError, match=r"target for agent_name 'coder' is a int"):
        sdk.rollout(graphs, {"messages": []}, object(), tokenizer=None)
