"""`EventLog`: timed graph nodes, LLM calls, engine calls and tools of one rollout, for its trace.

No live spans are opened while the rollout runs: a LangChain callback handler, owned by one
rollout and passed in that rollout's ``RunnableConfig``, appends plain records. Nesting comes
from LangChain's own ``parent_run_id``, so concurrent rollouts cannot mix their events, and the
MLflow trace is built afterwards, off the hot path (``agentrl_sdk.tracing.traces``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage

from agentrl_sdk.types import EventKind, RolloutEvent

_OBSERVATION_CHARS = 2000
"""Longest tool input/output or message text kept in an event (traces stay small)."""


class EventLog(BaseCallbackHandler):
    """Records one rollout's events; give it to exactly one graph run.

    ``run_inline`` keeps LangChain from hopping to a thread pool per event: each callback is a
    dict lookup and an append.
    """

    run_inline = True
    raise_error = False

    def __init__(self) -> None:
        self.events: list[RolloutEvent] = []
        self._open: dict[UUID, RolloutEvent] = {}
        self._by_id: dict[str, RolloutEvent] = {}
        self._parent: dict[UUID, str | None] = {}  # any run id -> nearest recorded event id

    # --- chains: the graph run and its nodes --------------------------------------------------
    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        parent = self._parent.get(parent_run_id) if parent_run_id else None
        name = kwargs.get("name") or ""
        node = (metadata or {}).get("langgraph_node")
        if parent_run_id is None:
            # The graph's input is kept whole: a trace's input is what replaying it starts from.
            self._start(run_id, "graph", name or "graph", None).inputs = inputs
        elif node is not None and name == node and not self._same_node(parent, name):
            self._start(run_id, "node", name, parent)
        else:
            self._parent[run_id] = parent  # plumbing (channel writes, inner callables): skipped

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        event = self._end(run_id)
        if event is not None and event.kind in ("graph", "node"):
            event.outputs = outputs

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._fail(run_id, error)

    on_llm_error = on_tool_error = on_chain_error

    # --- chat models ---------------------------------------------------------------------------
    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID,
        parent_run_id: UUID | None = None, **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "llm"
        self._start(run_id, "llm", name, self._parent.get(parent_run_id))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    # --- tools ---------------------------------------------------------------------------------
    def on_tool_start(
        self, serialized: Any, input_str: str, *, run_id: UUID,
        parent_run_id: UUID | None = None, inputs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        event = self._start(run_id, "tool", name, self._parent.get(parent_run_id))
        event.inputs = inputs if inputs is not None else input_str

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if (event := self._end(run_id)) is not None:
            event.outputs = output

    # --- the recorder's side -------------------------------------------------------------------
    def engine_call(
        self, llm_run_id: UUID | None, call_index: int, start_ns: int, end_ns: int, name: str
    ) -> None:
        """Attach the ledger's call ``call_index`` and its engine timing to the LLM event."""
        llm = self._open.get(llm_run_id) if llm_run_id else None
        if llm is not None:
            llm.call_index = call_index
        self.events.append(RolloutEvent(
            kind="engine", name=name, id=f"engine-{call_index}",
            parent_id=llm.id if llm else None, start_ns=start_ns, end_ns=end_ns,
            call_index=call_index,
        ))

    def finish(self) -> list[RolloutEvent]:
        """The events, closed (an event still open ends now) and made JSON-friendly."""
        now = time.time_ns()
        for event in self.events:
            if event.end_ns is None:
                event.end_ns = now
                event.error = event.error or "did not finish (rollout ended first)"
            limit = None if event.kind == "graph" else _OBSERVATION_CHARS
            event.inputs = jsonable(event.inputs, limit)
            event.outputs = jsonable(event.outputs, limit)
        self._open.clear()
        self._by_id.clear()
        return self.events

    def _start(self, run_id: UUID, kind: EventKind, name: str, parent: str | None) -> RolloutEvent:
        event = RolloutEvent(
            kind=kind, name=name, id=str(run_id), parent_id=parent, start_ns=time.time_ns()
        )
        self.events.append(event)
        self._open[run_id] = event
        self._by_id[event.id] = event
        self._parent[run_id] = event.id
        return event

    def _end(self, run_id: UUID) -> RolloutEvent | None:
        event = self._open.pop(run_id, None)
        if event is not None:
            event.end_ns = time.time_ns()
        return event

    def _fail(self, run_id: UUID, error: BaseException) -> None:
        if (event := self._end(run_id)) is not None:
            event.error = f"{type(error).__name__}: {error}"[:_OBSERVATION_CHARS]

    def _same_node(self, event_id: str | None, name: str) -> bool:
        """Whether ``event_id`` is the node ``name`` itself (LangGraph nests its callable)."""
        event = self._by_id.get(event_id) if event_id else None
        return event is not None and event.kind == "node" and event.name == name


def jsonable(value: Any, limit: int | None = _OBSERVATION_CHARS) -> Any:
    """Messages, dicts and lists as plain JSON values; texts longer than ``limit`` cut (None:
    kept whole). Anything else becomes its ``str``."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if limit is None or len(value) <= limit else value[:limit] + "…"
    if isinstance(value, BaseMessage):
        out: dict[str, Any] = {"type": value.type, "content": jsonable(value.content, limit)}
        for key in ("tool_calls", "invalid_tool_calls", "tool_call_id", "name", "status"):
            if getattr(value, key, None):
                out[key] = jsonable(getattr(value, key), limit)
        return out
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, limit) for v in value]
    return jsonable(str(value), limit)
