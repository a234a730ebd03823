"""Path rules attribute undecorated nodes: `sdk.trainable(...)`/`sdk.frozen()` as rules, the
first matching pattern wins, decorated nodes keep their decorator, unknown policies refused."""

from __future__ import annotations

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.api import with_node_rules
from agentrl_sdk.chat.attribution import attribute, graph_path
from agentrl_sdk.config import NodeRule
from agentrl_sdk.pipeline import TrainConfig


def test_graph_path_reads_the_checkpoint_namespace():
    ns = "researcher:1f2e|agent:9c3a"
    assert graph_path({"langgraph_checkpoint_ns": ns, "langgraph_node": "agent"}) == (
        "researcher/agent")
    assert graph_path({"langgraph_node": "agent"}) == "agent"
    assert graph_path(None) is None


def test_first_matching_rule_wins_else_the_path_under_the_default():
    rules = {"researcher/*": NodeRule(policy="r"), "*/agent": NodeRule(trained=False),
             "boss": NodeRule(name="supervisor", policy="s")}
    tag = attribute("researcher/agent", rules, default_trainable=True)
    assert (tag.name, tag.policy, tag.trained) == ("researcher/agent", "r", True)
    tag = attribute("coder/agent", rules, default_trainable=True)
    assert (tag.name, tag.policy, tag.trained) == ("coder/agent", "default", False)
    tag = attribute("boss", rules, default_trainable=True)
    assert (tag.name, tag.policy) == ("supervisor", "s")
    tag = attribute("other", rules, default_trainable=False)
    assert (tag.name, tag.policy, tag.trained) == ("other", "default", False)
    assert attribute(None, {}, default_trainable=True).name == "llm"


def test_marks_are_rules_and_decorators():
    mark = sdk.trainable("solver", policy="r")
    assert isinstance(mark, NodeRule) and (mark.name, mark.policy, mark.trained) == (
        "solver", "r", True)
    frozen = sdk.frozen()
    assert (frozen.trained, frozen.policy, frozen.name) == (False, "default", None)

    @mark
    def node(state):
        return state

    assert node.__agentrl_node__.name == "solver" and node({"x": 1}) == {"x": 1}


def test_train_rules_come_first_and_must_name_known_policies():
    config = TrainConfig.model_validate({
        "policies": {"r": {}},
        "rollout": {"nodes": {"coder/*": {"trained": False}, "researcher/*": {"policy": "r"}}},
    })
    merged = with_node_rules(config, {"researcher/*": sdk.frozen(), "x": {"policy": "r"}})
    assert list(merged.rollout.nodes) == ["researcher/*", "x", "coder/*"]
    assert merged.rollout.nodes["researcher/*"].trained is False
    with pytest.raises(ValueError, match="names policy 'nope'"):
        with_node_rules(config, {"a/*": sdk.trainable(policy="nope")})
    with pytest.raises(ValueError, match="names policy 'nope'"):
        TrainConfig.model_validate({"rollout": {"nodes": {"a": {"policy": "nope"}}}})
