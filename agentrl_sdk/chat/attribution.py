"""Which node (and policy) an LLM call belongs to, from where it runs in the graph.

LangGraph tells every call its checkpoint namespace: the chain of graph nodes it runs in,
outermost first (``researcher:<task>|agent:<task>``). Its path (``researcher/agent``) tells
apart the same prebuilt node placed in two workers, which the innermost node name cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from agentrl_sdk.config import NodeRule


@dataclass(frozen=True)
class NodeTag:
    """Attribution of the LLM calls made inside one graph node."""

    name: str
    policy: str = "default"
    trained: bool = True


UNNAMED_CALL = "llm"
"""The node name of a call made outside any graph node."""


def graph_path(metadata: Mapping[str, Any] | None) -> str | None:
    """The call's node path (``researcher/agent``) from its LangChain run metadata; None
    outside a LangGraph node."""
    metadata = metadata or {}
    if namespace := metadata.get("langgraph_checkpoint_ns"):
        return "/".join(part.split(":", 1)[0] for part in str(namespace).split("|"))
    return metadata.get("langgraph_node")


def attribute(
    path: str | None, rules: Mapping[str, NodeRule], *, default_trainable: bool
) -> NodeTag:
    """The attribution of a call from an undecorated node at ``path``: the first rule whose
    pattern matches the path, else the path itself under the default policy."""
    path = path or UNNAMED_CALL
    for pattern, rule in rules.items():
        if fnmatchcase(path, pattern):
            return NodeTag(rule.name or path, rule.policy, rule.trained)
    return NodeTag(path, trained=default_trainable)
