"""Scoring traces after the fact with a training job's own reward function.

The reward function a job trains with, ``reward(final_state, row, trajectory)`` (sync, async,
components, or a group reward such as ``sdk.rewards.judge``), scores traced requests too: the
final state is the traced output (its messages as LangChain messages again), the row is the
replayed row, the trajectory the traced ledger. Scoring runs through the same code as a
training step's (`agentrl_sdk.rollout.rewards.score`), so a failure is counted, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl_sdk.production.feedback import LeftOutReason
from agentrl_sdk.production.records import TraceRecord
from agentrl_sdk.production.replay import RowFn, replay_row
from agentrl_sdk.rollout.rewards import RewardFn, check_reward_fn, score

__all__ = ["RolloutReward", "rollout_reward", "score_records"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutReward:
    """A training reward function applied to traces (`rollout_reward`)."""

    reward_fn: RewardFn
    row_fn: RowFn | None = None


def rollout_reward(reward_fn: RewardFn, row_fn: RowFn | None = None) -> RolloutReward:
    """Score traces with a training reward function, for `sdk.traces(..., reward=...)`.

    Args:
        reward_fn: ``reward(final_state, row, trajectory)``, as `sdk.train` takes it.
        row_fn: The row the function reads for a trace (e.g. the input plus a ground truth
            from the trace's expectations); by default the replayed row (`replay_row`).

    Raises:
        TypeError: ``reward_fn`` cannot be called as ``reward(final_state, row, trajectory)``.
    """
    check_reward_fn(reward_fn)
    return RolloutReward(reward_fn, row_fn)


def score_records(
    records: Sequence[TraceRecord], spec: RolloutReward
) -> list[tuple[TraceRecord | None, LeftOutReason | None]]:
    """Each record with its reward, or why it has none: ``not_replayable`` (no row for it)
    or ``reward_error`` (the function raised or returned no number; logged).

    Raises:
        RuntimeError: called inside a running event loop (score traces from sync code).
    """
    rows: dict[str, Mapping[str, Any]] = {}
    trajectories = []
    for record in records:
        row = spec.row_fn(record) if spec.row_fn is not None else replay_row(record)
        if row is not None:
            rows[record.trace_id] = row
            traj = record.trajectory()
            traj.final_state = _state(record.outputs)
            trajectories.append(traj)
    asyncio.run(score(trajectories, rows, spec.reward_fn, on_error="drop"))
    scored = {t.row_id: t for t in trajectories}
    out: list[tuple[TraceRecord | None, LeftOutReason | None]] = []
    for record in records:
        if (traj := scored.get(record.trace_id)) is None:
            out.append((None, "not_replayable"))
        elif traj.reward is None:
            logger.warning("trace %s: %s", record.trace_id, traj.error)
            out.append((None, "reward_error"))
        else:
            out.append((record.model_copy(update={"reward": traj.reward}), None))
    return out


def _state(outputs: Any) -> Any:
    """The traced output as the graph returned it: its messages as LangChain messages."""
    if not isinstance(outputs, Mapping) or not isinstance(outputs.get("messages"), list):
        return outputs
    from langchain_core.messages import convert_to_messages

    try:
        return {**outputs, "messages": convert_to_messages(outputs["messages"])}
    except (ValueError, TypeError, KeyError):
        return outputs  # not messages after all: the function reads the data as it is
