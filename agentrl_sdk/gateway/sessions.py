"""Rollout sessions: one recorder (token ledger) per rollout id, opened and closed by the owner."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.types import RolloutEvent, Trajectory, TrajectoryStatus


class UnknownRolloutError(KeyError):
    """No open rollout has this id (never opened, or already closed)."""


@dataclass
class RolloutSession:
    """The calls of one rollout: its recorder and what went wrong, if anything."""

    rollout_id: str
    recorder: RolloutRecorder
    row_id: str = ""
    sample_index: int = 0
    status: TrajectoryStatus = "ok"
    error: str | None = None
    requests: int = 0
    metadata: dict[str, str] = field(default_factory=dict)

    def fail(self, status: TrajectoryStatus, error: str) -> None:
        """Remember the first failure; the trajectory reports it."""
        if self.status == "ok":
            self.status, self.error = status, error

    def record_llm_event(self, request_id: str, start_ns: int) -> None:
        """Time the call ``request_id`` as an LLM event around its engine event (traced
        rollouts only), so its trace span carries the call's token ids like a graph's."""
        events = self.recorder.events
        if events is None:
            return
        calls = self.recorder.ledger.calls
        index = next((i for i in reversed(range(len(calls)))
                      if calls[i].request_id == request_id), None)
        if index is None:
            return
        llm = RolloutEvent(kind="llm", name=f"llm · {calls[index].node}", id=f"llm-{index}",
                           start_ns=start_ns, end_ns=time.time_ns(), call_index=index)
        position = len(events.events)
        for i, event in enumerate(events.events):
            if event.kind == "engine" and event.call_index == index:
                event.parent_id, position = llm.id, i
                break
        events.events.insert(position, llm)  # before its engine event: parents come first

    def trajectory(self) -> Trajectory:
        """The rollout as the pipeline trains on it: the ledger's segments and calls."""
        recorder = self.recorder
        return Trajectory(
            row_id=self.row_id or self.rollout_id,
            sample_index=self.sample_index,
            segments=recorder.ledger.segments,
            calls=recorder.ledger.calls,
            status=self.status,
            error=self.error,
            rewards={k: float(v) for k, v in recorder.rewards.items()},
            metrics={k: float(v) for k, v in recorder.metrics.items()},
            events=recorder.events.finish() if recorder.events is not None else [],
        )


RecorderFactory = Callable[[str], RolloutRecorder]


class SessionRegistry:
    """The open rollouts of one gateway, by id.

    Args:
        recorder_factory: Builds the recorder of a rollout opened by id (``open`` without a
            recorder, or a first call under ``open_on_first_call``).
        open_on_first_call: Open unknown ids on first use instead of raising.
    """

    def __init__(
        self, recorder_factory: RecorderFactory | None = None, *, open_on_first_call: bool = False
    ) -> None:
        self._sessions: dict[str, RolloutSession] = {}
        self._factory = recorder_factory
        self._open_on_first_call = open_on_first_call

    def open(
        self,
        rollout_id: str | None = None,
        recorder: RolloutRecorder | None = None,
        *,
        row_id: str = "",
        sample_index: int = 0,
    ) -> RolloutSession:
        """Open a rollout (a fresh id when None) and return its session.

        Raises:
            ValueError: The id is already open, or there is neither a recorder nor a factory.
        """
        rollout_id = rollout_id or uuid.uuid4().hex
        if rollout_id in self._sessions:
            raise ValueError(f"rollout {rollout_id!r} is already open")
        if recorder is None:
            if self._factory is None:
                raise ValueError("no recorder given and the registry has no recorder factory")
            recorder = self._factory(rollout_id)
        session = RolloutSession(rollout_id, recorder, row_id=row_id, sample_index=sample_index)
        self._sessions[rollout_id] = session
        return session

    def get(self, rollout_id: str) -> RolloutSession:
        """The open session ``rollout_id`` (opened now under ``open_on_first_call``)."""
        session = self._sessions.get(rollout_id)
        if session is not None:
            return session
        if self._open_on_first_call and self._factory is not None:
            return self.open(rollout_id)
        raise UnknownRolloutError(rollout_id)

    def close(self, rollout_id: str) -> RolloutSession:
        """Close ``rollout_id``; later calls with it fail. Returns its session."""
        try:
            return self._sessions.pop(rollout_id)
        except KeyError:
            raise UnknownRolloutError(rollout_id) from None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._sessions
