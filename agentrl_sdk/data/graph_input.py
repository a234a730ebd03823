"""`GraphInputCheck`: does a row give its graph something to run on? Checked when the dataset
loads, so a row without ``messages`` is reported by index and field before any step instead of
failing every rollout later as a ``graph_error``.

Graphs are duck-typed (``ainvoke``, ``get_input_jsonschema``): the data layer imports no
LangGraph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentrl_sdk.data.schema import RowProblem
from agentrl_sdk.target import Target

__all__ = ["GraphInputCheck"]


class GraphInputCheck:
    """Turns each row into its graph input with ``input_fn`` and checks the graph can read it.

    A row is a problem when ``input_fn`` fails on it (a ``KeyError`` names the missing field),
    or when the input it makes holds none of the keys the graph's input schema declares:
    LangGraph would then start the graph on an empty state (e.g. the default input of a row
    with neither ``messages`` nor ``prompt`` given to a ``MessagesState`` graph). Only "none
    of them" is a problem: a state's other keys are usually written by its nodes, so a partial
    input is fine. Agent functions take the row itself and are not checked.

    Args:
        graph: A `Target`, or what `Target.of` takes: a compiled graph, an agent function,
            or ``{agent_name: either}``.
        input_fn: Row -> graph input; called once per row here, so it should be cheap and
            free of side effects (as the rollout calls it again).
    """

    def __init__(self, graph: Any, input_fn: Callable[[Mapping[str, Any]], Any]) -> None:
        self._target = Target.of(graph)
        self._input_fn = input_fn
        self._keys: dict[int, frozenset[str]] = {}

    def __call__(self, row: Mapping[str, Any], index: int) -> RowProblem | None:
        """None if ``row`` gives its graph an input it can read, else why not."""
        try:
            graph = self._target.for_row(row)
        except KeyError:  # an unknown agent_name: `load_rows` reports it
            return None
        if not hasattr(graph, "ainvoke"):
            return None
        name = getattr(self._input_fn, "__name__", "input_fn")
        try:
            value = self._input_fn(row)
        except KeyError as exc:
            field = str(exc.args[0]) if exc.args else "(row)"
            return RowProblem(index=index, field=field, message=f"the row has no {field!r}, "
                              f"which {name} reads to build the graph's input")
        except Exception as exc:  # noqa: BLE001 - user code; reported as the row's problem
            return RowProblem(index=index, field="(input_fn)",
                              message=f"{name} raised {type(exc).__name__}: {exc}")
        keys = self._input_keys(graph)
        if not keys or not isinstance(value, Mapping) or keys & set(value):
            return None
        field = "messages" if "messages" in keys else sorted(keys)[0]
        return RowProblem(
            index=index, field=field,
            message=f"the graph's input takes {sorted(keys)} and {name} made none of them from "
            f"this row (got keys {sorted(map(str, value))}); give the row 'messages' (or verl's "
            "'prompt') or pass an input_fn that builds the graph's input",
        )

    def _input_keys(self, graph: Any) -> frozenset[str]:
        """The keys of ``graph``'s input schema; empty when it has no readable schema."""
        cached = self._keys.get(id(graph))
        if cached is None:
            try:
                schema = graph.get_input_jsonschema()
                cached = frozenset(schema.get("properties") or ())
            except Exception:  # noqa: BLE001 - e.g. typing.TypedDict on 3.11 (pydantic refuses)
                cached = _state_fields(graph)
            self._keys[id(graph)] = cached
        return cached


def _state_fields(graph: Any) -> frozenset[str]:
    """The fields of the state class a LangGraph graph was built from (its builder keeps it),
    for states JSON schema cannot describe; empty when there is none to read."""
    builder = getattr(graph, "builder", None)
    state = getattr(builder, "input_schema", None) or getattr(builder, "schema", None)
    annotations = getattr(state, "__annotations__", None)
    return frozenset(annotations) if isinstance(annotations, Mapping) else frozenset()
