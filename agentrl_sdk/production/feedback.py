"""A trace's reward: a feedback value attached to it in MLflow, or a function of the record.

Feedback is what people, judges and rules attach to traces (``mlflow.log_feedback``, the MLflow
UI, labeling sessions). `read_reward` turns the latest valid value of one feedback name into a
number (``True`` is 1.0, ``False`` 0.0, a finite number itself) or calls the user's function on
the whole record; when neither gives a number, it says why, so the trace is left out and counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Literal

from agentrl_sdk.production.records import TraceRecord

__all__ = ["LeftOutReason", "RewardFn", "RewardSpec", "feedback_number", "read_reward"]

logger = logging.getLogger(__name__)

RewardFn = Callable[[TraceRecord], float | int | bool | None]
"""A user's reward over a trace record (its ``inputs``, ``outputs``, ``feedback``,
``expectations``, ``tags``): a number, or None to leave the trace out."""

RewardSpec = str | RewardFn | None
"""How `traces` reads a reward: a feedback name, a `RewardFn`, or None (no reward needed, as
when replaying prompts)."""

LeftOutReason = Literal[
    "no_feedback", "feedback_not_a_number", "no_reward", "reward_error", "redacted",
    "unreadable", "not_replayable", "not_exact", "stale",
]
"""Why a trace was left out: it has no feedback of the name asked for; its value is not a
boolean or a finite number; the reward function returned None (or a non-number); the reward
function raised; the redact hook dropped it; its ledger could not be read; its input is no
dataset row (`TraceSelection.rows`); its token ids are not exact under the tokenizer asked for
(`TraceSelection.exact`); its weights are too many versions old, or its request too old, to
train on off-policy (`TraceSelection.recent`)."""


def feedback_number(value: Any) -> float | None:
    """A feedback value as a reward: booleans as 1.0 / 0.0, finite numbers as themselves;
    None for anything else (text, lists, NaN). Text is never parsed: "yes" is no number."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def read_reward(record: TraceRecord, spec: RewardSpec) -> tuple[float | None, LeftOutReason | None]:
    """The record's reward under ``spec``, or why there is none.

    Returns:
        ``(reward, None)`` when there is one (``(None, None)`` when ``spec`` is None), else
        ``(None, reason)``.
    """
    if spec is None:
        return None, None
    if isinstance(spec, str):
        if spec not in record.feedback:
            return None, "no_feedback"
        number = feedback_number(record.feedback[spec])
        return (number, None) if number is not None else (None, "feedback_not_a_number")
    try:
        value = spec(record)
    except Exception as exc:  # noqa: BLE001 - the user's function; counted and logged
        logger.warning("the reward function failed on trace %s: %r", record.trace_id, exc)
        return None, "reward_error"
    number = feedback_number(value) if value is not None else None
    return (number, None) if number is not None else (None, "no_reward")
