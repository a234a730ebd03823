"""`traces`: select MLflow traces as training data, with their rewards and what was left out.

One call finds the traces (experiments, time range, tags, MLflow's filter string), reads each
one (`read_trace`), runs the redact hook, and reads its reward (`read_reward`). Every trace
that is found and not kept is counted under its reason in `TraceSelection.left_out`; none is
dropped silently. The selection then gives dataset rows (replay the prompts) or training
samples (the traced token ids, exactly).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl_sdk.identity import tokenizer_identity
from agentrl_sdk.production.feedback import LeftOutReason, RewardSpec, read_reward
from agentrl_sdk.production.reading import read_trace
from agentrl_sdk.production.records import TraceRecord
from agentrl_sdk.production.redact import Redact
from agentrl_sdk.production.replay import RowFn, replay_rows
from agentrl_sdk.production.rescoring import RolloutReward, score_records
from agentrl_sdk.production.search import TimeBound, search_filter, search_pages
from agentrl_sdk.production.tokens import token_problem, training_samples
from agentrl_sdk.tracing.view import experiment_ids, mlflow_client
from agentrl_sdk.types import Sample

__all__ = ["TraceSelection", "traces"]

logger = logging.getLogger(__name__)


@dataclass
class TraceSelection:
    """The traces selected for training and an account of those left out.

    Attributes:
        records: The kept traces, newest first, each with its reward (when one was asked for).
        left_out: Trace ids per reason they were not kept (`LeftOutReason`).
        found: Traces the search returned (kept plus left out at selection).
        filter_string: The MLflow filter the search ran.
    """

    records: list[TraceRecord]
    left_out: dict[LeftOutReason, list[str]] = field(default_factory=dict)
    found: int = 0
    filter_string: str | None = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def counts(self) -> dict[str, int]:
        """``found``, ``kept`` and the number left out per reason (``not_replayable``: kept
        records whose input gave no row in the last `rows` call)."""
        return {"found": self.found, "kept": len(self.records),
                **{reason: len(ids) for reason, ids in self.left_out.items()}}

    def rows(self, row_fn: RowFn | None = None) -> list[dict[str, Any]]:
        """The traced inputs as dataset rows for `sdk.train` (replay the prompts on-policy).

        Args:
            row_fn: A row per record (or None to leave it out); by default the input's chat
                messages (`agentrl_sdk.production.replay.replay_row`).

        Traces whose input gives no row are counted in ``left_out["not_replayable"]``.
        """
        rows, not_replayable = replay_rows(self.records, row_fn)
        self.left_out.pop("not_replayable", None)  # the count of this call's rows only
        if not_replayable:
            self.left_out["not_replayable"] = not_replayable
            logger.warning("%d of %d traces hold no replayable input (left_out['not_replayable'])",
                           len(not_replayable), len(self.records))
        return rows

    def exact(self, tokenizer: Any) -> TraceSelection:
        """The records whose token ids are exact under ``tokenizer`` (the same vocabulary, a
        consistent ledger); the others are counted in ``left_out["not_exact"]`` of the new
        selection (a store that holds traces of several models, or of other tools)."""
        expected = tokenizer_identity(tokenizer)
        return self._without(lambda record: token_problem(record, expected) is not None,
                             "not_exact")

    def recent(
        self, *, max_version_lag: int | None = None, max_age_s: float | None = None,
        now_ms: int | None = None,
    ) -> TraceSelection:
        """The records fresh enough to train on off-policy; the others counted in
        ``left_out["stale"]`` of the new selection.

        A record is stale when its oldest call was served by weights more than
        ``max_version_lag`` versions behind the newest version in the selection, or when its
        request started more than ``max_age_s`` seconds before ``now_ms`` (default: now).
        Importance correction weighs what stays; these bounds keep out the traces whose
        weights would mostly be truncated.
        """
        newest = max((v for r in self.records for v in r.policy_versions), default=0)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms

        def stale(record: TraceRecord) -> bool:
            versions = record.policy_versions
            too_far = max_version_lag is not None and bool(versions) and (
                newest - versions[0] > max_version_lag)
            too_old = max_age_s is not None and now_ms - record.timestamp_ms > max_age_s * 1000
            return too_far or too_old

        return self._without(stale, "stale")

    def _without(self, drop: Callable[[TraceRecord], bool], why: LeftOutReason) -> TraceSelection:
        """A new selection of the records ``drop`` keeps, those it drops counted under ``why``
        (beside this selection's own ``left_out``)."""
        kept, dropped = [], []
        for record in self.records:
            (dropped if drop(record) else kept).append(record)
        left_out = {k: list(v) for k, v in self.left_out.items()}
        if dropped:
            left_out[why] = [r.trace_id for r in dropped]
        return TraceSelection(kept, left_out, self.found, self.filter_string)

    def samples(
        self,
        tokenizer: Any,
        *,
        per_call: bool = False,
        group: Callable[[TraceRecord], str] | None = None,
    ) -> list[Sample]:
        """The traced token ids as training samples, exactly as recorded (see
        `agentrl_sdk.production.tokens.training_samples`).

        Raises:
            TraceMismatchError: a trace's ids are not exact under ``tokenizer``.
        """
        return training_samples(self.records, tokenizer, per_call=per_call, group=group)


def traces(
    tracking_uri: str,
    *,
    experiment: str | Sequence[str] | None = None,
    start: TimeBound = None,
    end: TimeBound = None,
    tags: Mapping[str, str] | None = None,
    filter_string: str | None = None,
    reward: RewardSpec | RolloutReward = None,
    redact: Redact | None = None,
    limit: int | None = 1000,
) -> TraceSelection:
    """Select MLflow traces as training data.

    Args:
        tracking_uri: The MLflow store (``sqlite:///mlflow.db``, ``http://host:5000``, ...).
        experiment: Experiment name(s) to search; every experiment when None.
        start: Requests that started at or after this time (a ``datetime``, or ms since the
            epoch).
        end: Requests that started before this time.
        tags: Tags every trace must carry with exactly these values.
        filter_string: Any further MLflow trace filter (``mlflow.search_traces`` syntax,
            e.g. ``"feedback.correct = 'true'"`` or ``"trace.status = 'OK'"``).
        reward: A feedback name (its latest valid value: ``True`` 1.0, ``False`` 0.0, or a
            number), a function of the `TraceRecord` returning a number or None, a training
            reward function applied to the traces (`rollout_reward`), or None when no reward
            is needed (replaying prompts).
        redact: A hook run on each record first (`agentrl_sdk.production.redact`).
        limit: Most traces searched (newest first); None searches all.

    Returns:
        The kept records and the ids left out per reason (`TraceSelection`).

    Raises:
        ValueError: an experiment does not exist, or the time range is empty.
    """
    client = mlflow_client(tracking_uri)
    locations = experiment_ids(client, experiment)
    where = search_filter(start=start, end=end, tags=tags, filter_string=filter_string)
    selection = TraceSelection(records=[], filter_string=where)
    if not locations:
        return selection
    rescored = isinstance(reward, RolloutReward)
    found = [(trace.info.trace_id, *_select(trace, None if rescored else reward, redact))
             for trace in search_pages(client, locations, where, limit)]
    if rescored:
        kept = iter(score_records([r for _, r, _ in found if r is not None], reward))
        found = [(i, *next(kept)) if r is not None else (i, r, why) for i, r, why in found]
    selection.found = len(found)
    for trace_id, record, reason in found:
        if record is not None:
            selection.records.append(record)
        else:
            selection.left_out.setdefault(reason or "unreadable", []).append(trace_id)
    if selection.left_out:
        logger.info("traces: kept %d of %d (%s)", len(selection.records), selection.found,
                    ", ".join(f"{k}: {len(v)}" for k, v in selection.left_out.items()))
    return selection


def _select(
    trace: Any, reward: RewardSpec, redact: Redact | None
) -> tuple[TraceRecord | None, LeftOutReason | None]:
    """The record to keep (with its reward), or why the trace is left out."""
    try:
        record = read_trace(trace)
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("trace %s cannot be read: %s", trace.info.trace_id, str(exc)[:300])
        return None, "unreadable"
    if redact is not None:
        kept = redact(record)
        if kept is None:
            return None, "redacted"
        record = kept
    value, reason = read_reward(record, reward)
    if reason is not None:
        return None, reason
    return record.model_copy(update={"reward": value}), None
