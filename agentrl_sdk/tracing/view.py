"""`TraceView`: what a person needs from one rollout's MLflow trace, read back from the store."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl_sdk.tracing.traces import TRACE_KINDS, TraceKind, ours


@dataclass
class SpanLine:
    """One span, flattened in tree order."""

    depth: int
    name: str
    kind: str
    duration_ms: float
    error: str | None = None
    inputs: Any = None
    outputs: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def details(self) -> list[tuple[str, Any]]:
        """What the span shows beside its name, as ``(label, value)``: a tool's ``in`` and
        ``out``, a chat model call's ``tokens``, the ``error``."""
        shown: list[tuple[str, Any]] = []
        if self.kind == "TOOL" and self.inputs is not None:
            shown.append(("in", self.inputs))
            if not self.error:
                out = self.outputs
                shown.append(("out", out.get("content") if isinstance(out, dict) else out))
        if self.kind == "CHAT_MODEL":
            a = self.attributes
            shown.append(("tokens", f"{len(a.get('prompt_ids', []))} prompt + "
                          f"{len(a.get('response_ids', []))} generated tokens · "
                          f"v{a.get('policy_version')} · {a.get('finish_reason')}"))
        if self.error:
            shown.append(("error", self.error))
        return shown


@dataclass
class TraceView:
    """A rollout's trace: its tags, rewards and credit, segments (ids, masks, text) and spans."""

    trace_id: str
    tags: dict[str, str]
    root: dict[str, Any]
    segments: list[dict[str, Any]]
    spans: list[SpanLine]

    @property
    def title(self) -> str:
        """``row R · sample S · step N`` (a tree rollout's tree: ``row R · tree T · step N``;
        a served request, which has no step: ``row R · sample 0``)."""
        which = (f"tree {self.root['tree_node']}" if "tree_node" in self.root
                 else f"sample {self.root.get('sample_index')}")
        step = self.root.get("step")
        return f"row {self.root.get('row_id')} · {which}" + (
            f" · step {step}" if step is not None else "")

    def summary(self) -> dict[str, Any]:
        """Status, reward (and components), advantage, loss share, versions, error; for a
        tree, its leaves, their mean reward and its credit."""
        keys = ("status", "reward", "rewards", "advantage", "loss_share", "policy_versions",
                "error", "leaves", "mean_reward", "credit")
        return {k: self.root.get(k) for k in keys}

    @classmethod
    def from_trace(cls, trace: Any) -> TraceView:
        """Read an ``mlflow.entities.Trace`` written by `build_trace`."""
        spans = trace.data.spans
        root_span = next(s for s in spans if s.parent_id is None)
        root = ours(root_span.attributes)
        children: dict[str | None, list[Any]] = {}
        for span in spans:
            children.setdefault(span.parent_id, []).append(span)
        lines: list[SpanLine] = []

        def walk(span: Any, depth: int) -> None:
            lines.append(_line(span, depth))
            for child in sorted(children.get(span.span_id, []), key=lambda s: s.start_time_ns):
                walk(child, depth + 1)

        walk(root_span, 0)
        return cls(trace.info.trace_id, dict(trace.info.tags), root,
                   root.pop("segments", None) or [], lines)


def _line(span: Any, depth: int) -> SpanLine:
    status = span.status
    error = status.description if str(status.status_code).endswith("ERROR") else None
    end = span.end_time_ns or span.start_time_ns
    return SpanLine(
        depth=depth, name=span.name, kind=str(span.span_type),
        duration_ms=(end - span.start_time_ns) / 1e6, error=error or None,
        inputs=span.inputs, outputs=span.outputs, attributes=ours(span.attributes),
    )


def search_rollout_traces(
    tracking_uri: str,
    *,
    experiment: str | None = None,
    run_id: str | None = None,
    step: int | None = None,
    status: str | None = None,
    row_id: str | None = None,
    phase: str | None = None,
    kind: TraceKind | None = None,
    limit: int = 50,
) -> list[Any]:
    """Infos of rollout traces (newest first) of a run, an experiment, or every experiment:
    one per traced rollout (tag ``kind = 'rollout'``) and, with ``rollout.tree``, one per
    tree that holds a traced leaf (``kind = 'tree'``, ``tree_path`` its root's index).

    Args:
        experiment: Experiment name; ignored when ``run_id`` is given.
        step, status, row_id: Filters on the trace tags.
        phase: ``train`` (training rollouts) or ``eval`` (held-out evaluations); both when None.
        kind: ``rollout`` or ``tree`` traces only; both when None (traces written before the
            ``kind`` tag existed are rollouts without it: only None lists them).

    Raises:
        ValueError: the run or experiment does not exist, ``kind`` is neither, or a filter
            value holds both ``'`` and ``"`` (MLflow's filters cannot quote it).
    """
    if kind is not None and kind not in TRACE_KINDS:
        raise ValueError(f"kind is one of {TRACE_KINDS} or None, not {kind!r}")
    client = mlflow_client(tracking_uri)
    locations = ([client.get_run(run_id).info.experiment_id] if run_id
                 else experiment_ids(client, experiment or None))
    clauses = [f"tags.{key} = {filter_literal(value)}" for key, value in
               (("step", step), ("status", status), ("row_id", row_id), ("phase", phase),
                ("kind", kind))
               if value is not None]
    traces = client.search_traces(
        locations=locations, filter_string=" AND ".join(clauses) or None, run_id=run_id,
        max_results=limit, order_by=["timestamp_ms DESC"], include_spans=False,
    )
    return [t.info for t in traces]


def load_trace_view(tracking_uri: str, trace_id: str) -> TraceView:
    """Fetch one trace and read it as a `TraceView`.

    Raises:
        ValueError: no trace ``trace_id`` in the store.
    """
    trace = mlflow_client(tracking_uri).get_trace(trace_id)
    if trace is None:
        raise ValueError(f"no trace {trace_id} in {tracking_uri}")
    return TraceView.from_trace(trace)


def filter_literal(value: object) -> str:
    """``value`` as a string literal of MLflow's search filter, which has no escapes: quoted
    with whichever quote it does not hold.

    Raises:
        ValueError: it holds both quotes, so no filter can name it.
    """
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    raise ValueError(f"MLflow's trace search cannot match {text!r}: it holds both ' and \"")


def mlflow_client(tracking_uri: str, timeout_s: float | None = None) -> Any:
    """An ``MlflowClient`` for ``tracking_uri``, with MLflow's usage telemetry off (as in the
    writer). With ``timeout_s``: one attempt per request, ``timeout_s`` each
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` unless set in the
    environment), so that a store that cannot be reached is reported quickly."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if timeout_s is not None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(timeout_s))))
    import mlflow

    return mlflow.MlflowClient(tracking_uri)


def experiment_ids(client: Any, experiment: str | Sequence[str] | None) -> list[str]:
    """The ids of the named experiments; every experiment's when None.

    Raises:
        ValueError: an experiment of that name does not exist.
    """
    if experiment is None:
        return [e.experiment_id for e in client.search_experiments()]
    names = [experiment] if isinstance(experiment, str) else list(experiment)
    ids = []
    for name in names:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise ValueError(f"no experiment named {name!r} in {client.tracking_uri}")
        ids.append(found.experiment_id)
    return ids
