"""Reading one MLflow trace as a `TraceRecord`: the request, its feedback, its token ledger.

Only MLflow's stored JSON is read (span attributes, inputs, outputs, assessments); nothing in a
trace is imported, unpickled or evaluated. A trace this SDK wrote (`agentrl_sdk.tracing`)
carries the ledger on its spans; any other trace yields a record without one.
"""

from __future__ import annotations

from typing import Any

from agentrl_sdk.identity import TokenizerIdentity
from agentrl_sdk.production.records import TraceRecord, TracedCall
from agentrl_sdk.tracing.traces import ours
from agentrl_sdk.types import Segment

__all__ = ["latest_assessments", "read_trace"]

_SEGMENT_FIELDS = tuple(Segment.model_fields)
_CALL_FIELDS = tuple(TracedCall.model_fields)


def read_trace(trace: Any) -> TraceRecord:
    """The record of an ``mlflow.entities.Trace`` fetched with its spans.

    Raises:
        ValueError: the trace has no root span, or its ledger attributes are malformed (a
            pydantic ``ValidationError``, also a ValueError).
    """
    info = trace.info
    spans = list(trace.data.spans) if trace.data is not None else []
    root = next((s for s in spans if s.parent_id is None), None)
    if root is None:
        raise ValueError(f"trace {info.trace_id} has no root span (was it fetched with spans?)")
    root_attrs = ours(root.attributes)
    inputs, outputs = root.inputs, root.outputs
    if "row_id" in root_attrs:  # a rollout's trace: the graph's input and output state
        inputs = _field(inputs, "input")
        outputs = _field(outputs, "output")
    feedback, expectations = latest_assessments(getattr(info, "assessments", None) or [])
    tokenizer = root_attrs.get("tokenizer")
    return TraceRecord(
        trace_id=info.trace_id,
        experiment_id=str(getattr(info, "experiment_id", "") or ""),
        timestamp_ms=int(info.request_time or 0),
        tags=dict(info.tags or {}),
        inputs=inputs,
        outputs=outputs,
        feedback=feedback,
        expectations=expectations,
        tokenizer=TokenizerIdentity.model_validate(tokenizer) if tokenizer else None,
        segments=[Segment.model_validate({k: v for k, v in seg.items() if k in _SEGMENT_FIELDS})
                  for seg in root_attrs.get("segments") or []],
        calls=_calls(spans),
    )


def latest_assessments(assessments: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latest valid value of each feedback name, and of each expectation name.

    A feedback that was overridden (``valid`` false) or that records an error instead of a
    value does not count; among the rest, the one created last wins.
    """
    feedback: dict[str, tuple[int, Any]] = {}
    expectations: dict[str, tuple[int, Any]] = {}
    for a in assessments:
        if a.valid is False:
            continue
        when = a.create_time_ms or 0
        if a.feedback is not None:
            if a.feedback.error is not None or a.feedback.value is None:
                continue
            target, value = feedback, a.feedback.value
        elif a.expectation is not None:
            target, value = expectations, a.expectation.value
        else:
            continue
        if a.name not in target or target[a.name][0] <= when:
            target[a.name] = (when, value)
    return ({k: v for k, (_, v) in feedback.items()},
            {k: v for k, (_, v) in expectations.items()})


def _calls(spans: list[Any]) -> list[TracedCall]:
    """The ledger's LLM calls, from the spans of kind ``llm`` that carry token ids."""
    found = []
    for span in spans:
        attrs = ours(span.attributes)
        if attrs.get("kind") != "llm" or "prompt_ids" not in attrs:
            continue
        call = {k: v for k, v in attrs.items() if k in _CALL_FIELDS}
        found.append((attrs["call_index"], TracedCall.model_validate(call)))
    return [call for _, call in sorted(found, key=lambda pair: pair[0])]


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None
