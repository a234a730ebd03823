"""`Target`: what the user trains or evaluates, resolved once where it enters the SDK.

A target is a compiled LangGraph graph (anything with ``ainvoke``), an agent function
``agent(endpoint, row)``, or a mapping of agent names to either; graphs are duck-typed here, so
every layer can take a `Target` without importing LangGraph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "is_agent_fn"]


def is_agent_fn(target: Any) -> bool:
    """Whether ``target`` is an agent function rather than a graph (which has ``ainvoke``)."""
    return callable(target) and not hasattr(target, "ainvoke")


@dataclass(frozen=True)
class Target:
    """The user's target, checked, with its agents by name.

    Attributes:
        agents: Each agent name's graph or agent function; a target given alone is
            ``"default"``.
        routed: The user gave a mapping: each row runs the agent its ``agent_name`` names
            (``"default"`` without one), the way verl's ``agent_name`` selects an agent loop.
    """

    agents: Mapping[str, Any]
    routed: bool = False

    @classmethod
    def of(cls, target: Any) -> Target:
        """``target`` resolved (a `Target` is returned as it is).

        Raises:
            TypeError: A target that can neither be invoked as a graph nor called as an agent
                function, naming what to pass instead (``builder.compile()`` for a
                `StateGraph`).
        """
        if isinstance(target, Target):
            return target
        routed = isinstance(target, Mapping)
        agents = dict(target) if routed else {"default": target}
        for name, agent in agents.items():
            if hasattr(agent, "ainvoke") or callable(agent):
                continue
            where = f" for agent_name {name!r}" if routed else ""
            if hasattr(agent, "compile"):  # a StateGraph builder: it runs only once compiled
                raise TypeError(f"the graph{where} is a {type(agent).__name__} builder, not a "
                                "compiled graph: pass graph.compile()")
            raise TypeError(f"the target{where} is a {type(agent).__name__}: pass a compiled "
                            "LangGraph graph, an agent function agent(endpoint, row), or a "
                            "mapping of agent names to either")
        return cls(agents, routed)

    @property
    def agent_names(self) -> set[str] | None:
        """The names a row's ``agent_name`` may take; None when any row runs the one target."""
        return set(self.agents) if self.routed else None

    @property
    def has_agent_fns(self) -> bool:
        """Whether an agent is an agent function (its rollouts then need the gateway)."""
        return any(is_agent_fn(agent) for agent in self.agents.values())

    def for_row(self, row: Mapping[str, Any]) -> Any:
        """The graph or agent function that runs ``row``.

        Raises:
            KeyError: The mapping has no agent for the row's ``agent_name``.
        """
        name = (row.get("agent_name") or "default") if self.routed else "default"
        if name not in self.agents:
            raise KeyError(f"no graph for agent_name {name!r} (known: "
                           f"{', '.join(sorted(self.agents))})")
        return self.agents[name]
