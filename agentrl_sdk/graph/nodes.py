"""`@trainable` and `@frozen`: mark the graph nodes whose LLM calls learn, or only run."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

from agentrl_sdk.chat.attribution import NodeTag
from agentrl_sdk.chat.context import current_node
from agentrl_sdk.config import NodeRule

F = TypeVar("F", bound=Callable[..., Any])


def _mark(func: F, tag: NodeTag) -> F:
    """Wrap a node so every LLM call made while it runs is attributed to ``tag``.

    ``functools.wraps`` keeps the signature, so LangGraph still injects ``config``/``store``.
    """
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_node(*args: Any, **kwargs: Any) -> Any:
            token = current_node.set(tag)
            try:
                return await func(*args, **kwargs)
            finally:
                current_node.reset(token)

        wrapper: Any = async_node
    else:

        @functools.wraps(func)
        def sync_node(*args: Any, **kwargs: Any) -> Any:
            token = current_node.set(tag)
            try:
                return func(*args, **kwargs)
            finally:
                current_node.reset(token)

        wrapper = sync_node
    wrapper.__agentrl_node__ = tag
    return wrapper


class NodeMark(NodeRule):
    """``trainable(...)`` / ``frozen(...)`` with arguments: decorates a node, and is the rule
    for the nodes a path pattern matches in ``sdk.train(..., nodes={pattern: mark})``."""

    def __call__(self, func: F) -> F:
        return _mark(func, NodeTag(self.name or func.__name__, self.policy, self.trained))


@overload
def trainable(name: F) -> F: ...
@overload
def trainable(name: str | None = None, *, policy: str = "default") -> NodeMark: ...
def trainable(name: Any = None, *, policy: str = "default") -> Any:
    """Mark a node whose LLM calls are trained.

    Usable bare (``@trainable``) or with a name and policy (``@trainable("solver",
    policy="solver")``); the name defaults to the function's name. With arguments it is also
    a rule for nodes you do not decorate: ``sdk.train(..., nodes={"researcher/*":
    sdk.trainable(policy="researcher")})``.

    Args:
        name: Name recorded on the node's segments.
        policy: The policy (set of weights) that serves and learns from the node.
    """
    return _decorator(name, policy, trained=True)


@overload
def frozen(name: F) -> F: ...
@overload
def frozen(name: str | None = None, *, policy: str = "default") -> NodeMark: ...
def frozen(name: Any = None, *, policy: str = "default") -> Any:
    """Mark a node whose LLM calls run and are recorded, but are never trained."""
    return _decorator(name, policy, trained=False)


def _decorator(name: Any, policy: str, *, trained: bool) -> Any:
    if callable(name):
        return _mark(name, NodeTag(name.__name__, policy, trained))
    return NodeMark(name=name, policy=policy, trained=trained)
