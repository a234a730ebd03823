"""Traced token ids as training samples, exactly as recorded, under the right tokenizer only.

A sample built here holds the ids, behaviour logprobs and policy versions the trace recorded,
cut into sequences by the same code that cuts fresh rollouts (`agentrl_sdk.rollout.samples`).
Nothing is retokenized: a trace whose ids came from another vocabulary than the model being
trained, or from an unknown one, is refused with `TraceMismatchError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentrl_sdk.errors import TraceMismatchError
from agentrl_sdk.identity import TokenizerIdentity, tokenizer_identity
from agentrl_sdk.production.records import TraceRecord
from agentrl_sdk.rollout.credit import credit_policies
from agentrl_sdk.rollout.samples import samples_of
from agentrl_sdk.types import Sample

__all__ = [
    "check_tokenizer", "ledger_problem", "token_problem", "training_batch", "training_samples",
]

_SHOWN = 3
"""Trace ids a refusal names per kind of problem."""


def check_tokenizer(records: Sequence[TraceRecord], tokenizer: Any) -> TokenizerIdentity:
    """The training tokenizer's identity, once every record's ids are known to be exact under it.

    Raises:
        TraceMismatchError: a record holds no token ledger, records no tokenizer identity,
            was made under another vocabulary, or its calls disagree with its segments. The
            message names the traces (a few of each kind) and both identities.
    """
    expected = tokenizer_identity(tokenizer)
    problems: dict[str, list[str]] = {}
    for record in records:
        if (problem := token_problem(record, expected)) is not None:
            problems.setdefault(problem, []).append(record.trace_id)
    if problems:
        lines = [f"{len(ids)} trace(s) {problem}: {', '.join(ids[:_SHOWN])}"
                 + (" ..." if len(ids) > _SHOWN else "") for problem, ids in problems.items()]
        raise TraceMismatchError(
            f"refusing to train on traced token ids under tokenizer {expected}:\n  "
            + "\n  ".join(lines)
            + "\nTraced ids are trained as recorded and never retokenized: train the model the "
            "traces were served by, or replay their prompts instead (TraceSelection.rows)."
        )
    return expected


def ledger_problem(record: TraceRecord) -> str | None:
    """Why the record's calls disagree with its segments (each call's prompt must be the start
    of its segment, its response the ids that follow), or None when they agree."""
    for index, call in enumerate(record.calls):
        if not 0 <= call.segment_index < len(record.segments):
            return f"call {index} names segment {call.segment_index}, which is not traced"
        seg = record.segments[call.segment_index]
        stop = call.segment_offset + len(call.response_ids)
        if (call.prompt_ids != seg.prompt_ids + seg.response_ids[: call.segment_offset]
                or call.response_ids != seg.response_ids[call.segment_offset : stop]):
            return f"call {index}'s ids are not those of segment {call.segment_index}"
    return None


def training_batch(
    records: Sequence[TraceRecord],
    tokenizer: Any,
    *,
    per_call: bool = False,
    group: Callable[[TraceRecord], str] | None = None,
) -> tuple[list[Sample], dict[str, object]]:
    """The records' trained segments (or calls) as samples: traced ids, logprobs and versions,
    each record's reward, zero advantages (an estimator fills them); and the `Sequences` fields
    the samples add (per-call step rewards), for the estimator.

    Args:
        records: Records with a reward (`traces` with ``reward=``) and a token ledger.
        tokenizer: The tokenizer of the model to be trained.
        per_call: One sample per trained call instead of per trained segment.
        group: A record's group key (``row_id``): advantages compare records of one group
            (e.g. a prompt template or a task); the trace id (a group of one) when None.

    Raises:
        TraceMismatchError: as `check_tokenizer`.
        ValueError: a record has no reward.
    """
    check_tokenizer(records, tokenizer)
    if unscored := [r.trace_id for r in records if r.reward is None]:
        raise ValueError(
            f"{len(unscored)} trace(s) have no reward (e.g. {unscored[0]}): select them with "
            "sdk.traces(..., reward='FEEDBACK NAME' or a function)"
        )
    trajectories = [r.trajectory(group(r) if group else None) for r in records]
    for index, traj in enumerate(trajectories):
        traj.sample_index = index
    return samples_of(credit_policies(trajectories), per_call=per_call)


def training_samples(
    records: Sequence[TraceRecord],
    tokenizer: Any,
    *,
    per_call: bool = False,
    group: Callable[[TraceRecord], str] | None = None,
) -> list[Sample]:
    """The samples of `training_batch`."""
    return training_batch(records, tokenizer, per_call=per_call, group=group)[0]


def token_problem(record: TraceRecord, expected: TokenizerIdentity) -> str | None:
    """Why ``record``'s ids are not exact under the tokenizer ``expected`` names, or None."""
    if not record.has_ledger:
        return "hold no token ledger (not written by agentrl_sdk)"
    if record.tokenizer is None:
        return "record no tokenizer identity"
    if not record.tokenizer.same_vocabulary(expected):
        return f"were made by tokenizer {record.tokenizer}"
    ledger = ledger_problem(record)
    return f"have an inconsistent ledger ({ledger})" if ledger else None
