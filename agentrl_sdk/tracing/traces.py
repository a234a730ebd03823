"""One MLflow trace per sampled rollout, built after the step from the rollout's recorded events.

Spans follow the graph: rollout (root) → node → LLM call → engine call, with tool spans under
their node. Nothing is traced live: `build_trace` turns a finished `Trajectory` (its
``events``, ``calls`` and ``segments``) into MLflow span entities with explicit ids, parents and
timestamps, and `write_traces` logs a whole step's traces in one batch. So concurrent rollouts
cannot mis-parent spans, and the rollout itself only pays for appending events.

`build_trace_payload` is the same trace as plain data (span dicts, cheap to pickle): what the
run's writer process receives (`agentrl_sdk.tracing.writer`), turned into entities over there.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any, Literal, get_args

from agentrl_sdk.algorithms.aggregation import LossAgg, loss_shares, sequence_mass
from agentrl_sdk.identity import tokenizer_identity
from agentrl_sdk.tracing._writer_process import write_traces
from agentrl_sdk.types import RolloutEvent, Sample, Trajectory

if TYPE_CHECKING:
    from mlflow.entities import Span, TraceInfo

TracePayload = tuple["TraceInfo", list[dict[str, Any]]]
"""A built trace as data: its info and its spans as ``Span.from_dict`` dicts."""

TraceSampling = Literal["all", "first_k", "failures", "off"]
"""Which rollouts of a step get a trace: all, those of the first k rows, failed ones, none."""

ATTR = "agentrl."
"""Prefix of every attribute this package sets on spans."""


def ours(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The attributes of a span this package set (``ATTR`` dropped from their names)."""
    return {k[len(ATTR):]: v for k, v in (attrs or {}).items() if k.startswith(ATTR)}


def attributes(**fields: Any) -> dict[str, Any]:
    """``fields`` as span attributes of this package (named with ``ATTR``), as `ours` reads."""
    return {ATTR + k: v for k, v in fields.items()}


TraceKind = Literal["rollout", "tree"]
"""A trace's ``kind`` tag: one rollout, or a tree rollout's whole tree (`tree_traces`)."""

TRACE_KINDS: tuple[TraceKind, ...] = get_args(TraceKind)
_ROLLOUT: TraceKind = "rollout"

_SPAN_TYPES = {"node": "CHAIN", "llm": "CHAT_MODEL", "engine": "LLM", "tool": "TOOL",
               "reward": "EVALUATOR"}
_MALFORMED = "Error: malformed tool call"


@dataclass(frozen=True)
class RolloutCredit:
    """What the update made of one rollout: its advantage and its share of the loss."""

    advantage: float
    loss_share: float


def select_rollouts(
    trajectories: Sequence[Trajectory], mode: TraceSampling, k: int = 1
) -> list[Trajectory]:
    """The rollouts to trace under ``mode`` (``first_k``: every sample of the first ``k`` rows)."""
    if mode == "all":
        return list(trajectories)
    if mode == "failures":
        return [t for t in trajectories if t.status != "ok"]
    if mode == "first_k":
        rows = list(dict.fromkeys(t.row_id for t in trajectories))[:k]
        return [t for t in trajectories if t.row_id in rows]
    return []


def rollout_credit(
    samples: Iterable[Sample], agg: LossAgg = "seq-mean-token-mean"
) -> dict[tuple[str, int], RolloutCredit]:
    """Each rollout's advantage and share of the aggregated loss's weight (shares sum to 1):
    the sum of its samples' `sequence_mass` over the batch's."""
    mass: dict[tuple[str, int], float] = {}
    advantage: dict[tuple[str, int], float] = {}
    for s in samples:
        key = (s.row_id, s.sample_index)
        mass[key] = mass.get(key, 0.0) + float(sequence_mass(s.weight, sum(s.response_mask), agg))
        advantage[key] = s.advantage
    return {key: RolloutCredit(advantage[key], share) for key, share in loss_shares(mass).items()}


def trace_tags(
    traj: Trajectory, step: int | None, run_id: str | None, phase: str = "train"
) -> dict[str, str]:
    """The searchable tags of a rollout's trace (``tags.step = '3'``, ``tags.status = 'ok'``,
    ``tags.phase = 'eval'``); no ``step`` tag when ``step`` is None (a served request)."""
    versions = sorted({c.policy_version for c in traj.calls})
    tags = {
        "phase": phase,
        "kind": _ROLLOUT,
        "row_id": traj.row_id,
        "sample_index": str(traj.sample_index),
        "status": traj.status,
        "policy_versions": ",".join(map(str, versions)),
        "mlflow.traceName": f"rollout {traj.row_id}#{traj.sample_index}",
    }
    if step is not None:
        tags["step"] = str(step)
    if traj.reward is not None:
        tags["reward"] = f"{traj.reward:g}"
    if traj.tree_path:
        tags["tree_path"] = ".".join(map(str, traj.tree_path))
        tags["mlflow.traceName"] += f" (tree {tags['tree_path']})"
    if run_id:
        tags["run_id"] = run_id
    return tags


def build_trace(traj: Trajectory, **options: Any) -> tuple[TraceInfo, list[Span]]:
    """The MLflow trace of one finished rollout: its info (tags, status) and its spans; the
    options are `build_trace_payload`'s."""
    return trace_entities(build_trace_payload(traj, **options))


def trace_entities(payload: TracePayload) -> tuple[TraceInfo, list[Span]]:
    """A payload's span dicts as MLflow ``Span`` entities."""
    from mlflow.entities import Span

    info, spans = payload
    return info, [Span.from_dict(span) for span in spans]


def build_trace_payload(
    traj: Trajectory,
    *,
    experiment_id: str,
    step: int | None,
    run_id: str | None = None,
    credit: RolloutCredit | None = None,
    tokenizer: Any = None,
    phase: str = "train",
    tree: list[dict] | None = None,
    trace_id: int | None = None,
    tags_extra: Mapping[str, str] | None = None,
) -> TracePayload:
    """`build_trace` as data: the info and the spans as dicts.

    Args:
        traj: The rollout, with ``events`` recorded (``arollout(..., record_events=True)``);
            without events the trace holds the root span only.
        step: Training step, a tag (None: no step, as for a served request).
        run_id: The training job's MLflow run; the trace is linked to it.
        credit: The rollout's advantage and loss share, when it was trained on.
        tokenizer: Decodes token ids into the spans' text; ids only when None.
        phase: ``train`` (a training step's rollout) or ``eval`` (a held-out one), a tag.
        tree: A tree leaf's `tree_credit`.
        trace_id: The 128-bit OpenTelemetry trace id (the MLflow id is ``tr-`` and its 32 hex
            digits, `mlflow_trace_id`); a random one when None.
        tags_extra: More tags, set last (they may rename the trace: ``mlflow.traceName``).
    """
    builder = SpanBuilder(random.getrandbits(128) if trace_id is None else trace_id)
    graph = next((e for e in traj.events if e.kind == "graph"), None)
    times = [e.start_ns for e in traj.events] + [e.end_ns or 0 for e in traj.events]
    start, end = (graph.start_ns, graph.end_ns or max(times)) if graph else (
        (min(times), max(times)) if times else now_pair()
    )
    root_attrs = _root_attributes(traj, step, credit, tokenizer, tree)
    inputs = {"row_id": traj.row_id, "sample_index": traj.sample_index, "step": step,
              "input": graph.inputs if graph else None}
    own = ours(root_attrs)
    outputs = {k: own[k]
               for k in ("status", "reward", "rewards", "advantage", "loss_share", "error")}
    outputs["output"] = graph.outputs if graph else None
    if tree is not None:
        outputs["tree"] = tree
    root = builder.add(None, f"rollout {traj.row_id}#{traj.sample_index}", "AGENT", start, end,
                       inputs, outputs, root_attrs, traj.error if traj.status != "ok" else None)
    ids = {graph.id: root} if graph else {}
    for event in traj.events:
        if event.kind != "graph":
            _add_event(builder, event, ids, root, traj, tokenizer)
    tags = trace_tags(traj, step, run_id, phase)
    if credit is not None:
        tags["advantage"] = f"{credit.advantage:.4g}"
    tags.update(tags_extra or {})
    return trace_info(builder, experiment_id, start, end, traj.status == "ok", inputs,
                      json.dumps(outputs), run_id, tags), builder.spans


def trace_info(builder: SpanBuilder, experiment_id: str, start: int, end: int, ok: bool,
               inputs: Any, outputs: str, run_id: str | None, tags: dict[str, str]) -> TraceInfo:
    """The info of the trace ``builder`` holds (``outputs``: its JSON response), linked to the
    MLflow run ``run_id`` when given."""
    from mlflow.entities import TraceInfo, TraceLocation, TraceState

    return TraceInfo(
        trace_id=builder.trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start // 1_000_000,
        execution_duration=max(0, (end - start) // 1_000_000),
        state=TraceState.OK if ok else TraceState.ERROR,
        request_preview=json.dumps(inputs),
        response_preview=outputs[:1000],
        trace_metadata={"mlflow.sourceRun": run_id} if run_id else {},
        tags=tags,
    )


# --- span assembly -------------------------------------------------------------------------------
def mlflow_trace_id(otel_trace_id: int) -> str:
    """The MLflow trace id of a 128-bit OpenTelemetry trace id (``tr-`` and 32 hex digits)."""
    return f"tr-{otel_trace_id:032x}"


class SpanBuilder:
    """Span dicts of one trace (``Span.from_dict``'s format), with sequential span ids."""

    def __init__(self, otel_trace_id: int) -> None:
        self.otel_trace_id = otel_trace_id
        self.trace_id = mlflow_trace_id(otel_trace_id)
        self.spans: list[dict[str, Any]] = []
        self._b64_trace = _b64(otel_trace_id, 16)

    def add(self, parent: int | None, name: str, span_type: str, start: int, end: int,
            inputs: Any, outputs: Any, attributes: Mapping[str, Any], error: str | None) -> int:
        span_id = len(self.spans) + 1
        attrs = {"mlflow.traceRequestId": self.trace_id, "mlflow.spanType": span_type,
                 "mlflow.spanInputs": inputs, "mlflow.spanOutputs": outputs, **attributes}
        events = []
        if error:
            events.append({"name": "exception", "time_unix_nano": end,
                           "attributes": {"exception.message": error}})
        self.spans.append({
            "trace_id": self._b64_trace,
            "span_id": _b64(span_id, 8),
            "parent_span_id": _b64(parent, 8) if parent else None,
            "name": name,
            "start_time_unix_nano": start,
            "end_time_unix_nano": max(start, end),
            "events": events,
            "status": {"code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK",
                       "message": error or ""},
            "attributes": {k: json.dumps(v) for k, v in attrs.items() if v is not None},
        })
        return span_id


def _add_event(builder: SpanBuilder, event: RolloutEvent, ids: dict[str, int], root: int,
               traj: Trajectory, tokenizer: Any) -> None:
    parent = ids.get(event.parent_id or "", root)
    end = event.end_ns or event.start_ns
    attrs = attributes(kind=event.kind)
    inputs, outputs, name = event.inputs, event.outputs, event.name
    call = traj.calls[event.call_index] if event.call_index is not None else None
    if call is not None and event.kind == "llm":
        attrs.update(_call_attributes(traj, event.call_index or 0))
        name = f"llm · {call.node} · turn {call.turn}"
        inputs = {"prompt_text": decode_ids(tokenizer, call.prompt_ids)}
        outputs = {"response_text": decode_ids(tokenizer, call.response_ids),
                   "finish_reason": call.finish_reason}
    elif call is not None and event.kind == "engine":
        attrs.update(attributes(request_id=call.request_id, prompt_tokens=len(call.prompt_ids),
                                generated_tokens=len(call.response_ids),
                                policy_version=call.policy_version))
        inputs = {"request_id": call.request_id, "prompt_tokens": len(call.prompt_ids)}
        outputs = {"token_ids": call.response_ids, "finish_reason": call.finish_reason}
    span = builder.add(parent, name, _SPAN_TYPES[event.kind], event.start_ns, end,
                       inputs, outputs, attrs, event.error)
    ids[event.id] = span
    if event.kind == "node":
        for message in _malformed_calls(event.outputs):
            builder.add(span, f"{message.get('name') or 'unknown'} (malformed call)", "TOOL",
                        end, end, None, message, attributes(kind="tool"), message["content"])


def _call_attributes(traj: Trajectory, index: int) -> dict[str, Any]:
    """Token-level attributes of LLM call ``index``, located in its segment."""
    call = traj.calls[index]
    seg = traj.segments[call.segment_index]
    offset = call.prompt_length - len(seg.prompt_ids)
    stop = offset + len(call.response_ids)
    return attributes(
        node=call.node, policy=call.policy, turn=call.turn, trained=call.trained,
        call_index=index, segment_index=call.segment_index, segment_offset=offset,
        request_id=call.request_id, finish_reason=call.finish_reason,
        policy_version=call.policy_version, prompt_ids=call.prompt_ids,
        response_ids=call.response_ids, response_logprobs=call.response_logprobs,
        response_mask=seg.response_mask[offset:stop],
    )


def _root_attributes(traj: Trajectory, step: int, credit: RolloutCredit | None,
                     tokenizer: Any, tree: list[dict] | None) -> dict[str, Any]:
    return attributes(
        row_id=traj.row_id, sample_index=traj.sample_index, step=step, status=traj.status,
        error=traj.error, reward=traj.reward, rewards=traj.rewards,
        reward_components=[c.model_dump() for c in traj.components],
        advantage=credit.advantage if credit else None,
        loss_share=credit.loss_share if credit else None,
        policy_versions=sorted({c.policy_version for c in traj.calls}), metrics=traj.metrics,
        segments=[_segment_view(s, tokenizer) for s in traj.segments],
        tokenizer=(tokenizer_identity(tokenizer).model_dump()
                   if hasattr(tokenizer, "get_vocab") else None),
        tree=tree,
    )


def _segment_view(seg: Any, tokenizer: Any) -> dict[str, Any]:
    """A segment's ids, mask, logprobs and versions, plus its text decoded run by run."""
    runs, pos = [], 0
    for mask, run in groupby(seg.response_mask):
        n = len(list(run))
        ids = seg.response_ids[pos : pos + n]
        runs.append({"mask": mask, "start": pos, "end": pos + n, "text": decode_ids(tokenizer, ids)})
        pos += n
    return seg.model_dump() | {"prompt_text": decode_ids(tokenizer, seg.prompt_ids), "runs": runs}


def _malformed_calls(outputs: Any) -> list[dict[str, Any]]:
    messages = outputs.get("messages", []) if isinstance(outputs, dict) else []
    return [m for m in messages if isinstance(m, dict) and m.get("type") == "tool"
            and str(m.get("content", "")).startswith(_MALFORMED)]


def decode_ids(tokenizer: Any, ids: list[int]) -> str | None:
    return tokenizer.decode(ids) if tokenizer is not None else None


def _b64(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big")).decode()


def now_pair() -> tuple[int, int]:
    return (time.time_ns(),) * 2
