"""Rollout sessions: one recorder (token ledger) per rollout id, opened and closed by the owner."""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.gateway.stats import GatewayStats
from agentrl_sdk.types import RolloutEvent, Trajectory, TrajectoryStatus

logger = logging.getLogger(__name__)


class UnknownRolloutError(KeyError):
    """No open rollout has this id (never opened, or already closed)."""


class ExpiredRolloutError(UnknownRolloutError):
    """The client rollout with this id was dropped after ``client_rollout_ttl_s`` idle."""


class TooManyRolloutsError(AgentRLError):
    """Clients already hold ``max_client_rollouts`` open rollouts."""


@dataclass
class RolloutSession:
    """The calls of one rollout: its recorder and what went wrong, if anything."""

    rollout_id: str
    recorder: RolloutRecorder
    row_id: str = ""
    sample_index: int = 0
    status: TrajectoryStatus = "ok"
    error: str | None = None

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
        """The rollout as the pipeline trains on it (`RolloutRecorder.trajectory`)."""
        return self.recorder.trajectory(self.row_id or self.rollout_id, self.sample_index,
                                        self.status, self.error)


RecorderFactory = Callable[[str], RolloutRecorder]


class SessionRegistry:
    """The open rollouts of one gateway, by id.

    Rollouts opened by clients over HTTP (``by_client``) are bounded: at most ``max_client``
    at once, and one idle for ``client_ttl_s`` is dropped; an owner that opens rollouts
    in-process (the pipeline) closes them itself and is not bounded.

    Args:
        recorder_factory: Builds the recorder of a rollout opened by id (``open`` without a
            recorder, or a first call under ``open_on_first_call``).
        open_on_first_call: `get_or_open` opens unknown ids instead of raising.
        stats: Where opened, expired and refused client rollouts are counted.
        clock: Monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        recorder_factory: RecorderFactory | None = None,
        *,
        open_on_first_call: bool = False,
        max_client: int = 256,
        client_ttl_s: float = 600.0,
        stats: GatewayStats | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions: dict[str, RolloutSession] = {}
        self._factory = recorder_factory
        self._open_on_first_call = open_on_first_call
        self._max_client = max_client
        self._client_ttl_s = client_ttl_s
        self.stats = stats or GatewayStats()
        self._clock = clock
        # Client rollouts by last use, least recent first (so expiry stops at the first live one).
        self._client_used: OrderedDict[str, float] = OrderedDict()
        # Ids dropped by expiry, remembered (as many as may be open) to answer "expired".
        self._expired: OrderedDict[str, None] = OrderedDict()

    def open(
        self,
        rollout_id: str | None = None,
        recorder: RolloutRecorder | None = None,
        *,
        row_id: str = "",
        sample_index: int = 0,
        by_client: bool = False,
    ) -> RolloutSession:
        """Open a rollout (a fresh id when None) and return its session.

        Args:
            by_client: Opened by a client over HTTP: counted against ``max_client`` and
                dropped after ``client_ttl_s`` idle.

        Raises:
            ValueError: The id is already open, or there is neither a recorder nor a factory.
            TooManyRolloutsError: ``by_client`` and clients hold ``max_client`` rollouts.
        """
        rollout_id = rollout_id or uuid.uuid4().hex
        if rollout_id in self._sessions:
            raise ValueError(f"rollout {rollout_id!r} is already open")
        if by_client:
            self.expire()
            if len(self._client_used) >= self._max_client:
                self.stats.client_rollouts_refused += 1
                raise TooManyRolloutsError(
                    f"{len(self._client_used)} client rollouts are open, the most this gateway "
                    f"holds (max_client_rollouts): close finished ones with DELETE "
                    f"/rollouts/<id>; idle ones are dropped after {self._client_ttl_s:g}s"
                )
        if recorder is None:
            if self._factory is None:
                raise ValueError("no recorder given and the registry has no recorder factory")
            recorder = self._factory(rollout_id)
        session = RolloutSession(rollout_id, recorder, row_id=row_id, sample_index=sample_index)
        self._sessions[rollout_id] = session
        self._expired.pop(rollout_id, None)
        if by_client:
            self._client_used[rollout_id] = self._clock()
            self.stats.client_rollouts_opened += 1
        return session

    def get(self, rollout_id: str) -> RolloutSession:
        """The open session ``rollout_id``; never opens one (reads and rewards of an unknown id
        are mistakes, not a start).

        Raises:
            UnknownRolloutError: No such open rollout (`ExpiredRolloutError` if it was
                dropped after ``client_ttl_s`` idle).
        """
        self.expire()
        session = self._sessions.get(rollout_id)
        if session is None:
            raise self._unknown(rollout_id)
        if rollout_id in self._client_used:
            self._client_used[rollout_id] = self._clock()
            self._client_used.move_to_end(rollout_id)
        return session

    def get_or_open(self, rollout_id: str) -> RolloutSession:
        """`get`, or under ``open_on_first_call`` open an unknown id as a client rollout.

        Raises:
            UnknownRolloutError: Unknown (or expired) and not opened on first call.
            TooManyRolloutsError: Opening it would pass ``max_client``.
        """
        try:
            return self.get(rollout_id)
        except ExpiredRolloutError:
            raise
        except UnknownRolloutError:
            if not (self._open_on_first_call and self._factory is not None):
                raise
        return self.open(rollout_id, by_client=True)

    def close(self, rollout_id: str) -> RolloutSession:
        """Close ``rollout_id``; later calls with it fail. Returns its session."""
        self._client_used.pop(rollout_id, None)
        try:
            return self._sessions.pop(rollout_id)
        except KeyError:
            raise self._unknown(rollout_id) from None

    def expire(self) -> int:
        """Drop the client rollouts idle for ``client_ttl_s``; returns how many."""
        deadline = self._clock() - self._client_ttl_s
        dropped = 0
        while self._client_used:
            rollout_id, used = next(iter(self._client_used.items()))
            if used > deadline:
                break
            del self._client_used[rollout_id]
            self._sessions.pop(rollout_id, None)
            self._expired[rollout_id] = None
            if len(self._expired) > self._max_client:
                self._expired.popitem(last=False)
            dropped += 1
        if dropped:
            self.stats.client_rollouts_expired += dropped
            logger.warning("gateway: dropped %d client rollouts idle for %gs "
                           "(client_rollout_ttl_s); close rollouts with DELETE /rollouts/<id>",
                           dropped, self._client_ttl_s)
        return dropped

    def _unknown(self, rollout_id: str) -> UnknownRolloutError:
        expired = rollout_id in self._expired
        return (ExpiredRolloutError if expired else UnknownRolloutError)(rollout_id)

    @property
    def client_rollouts(self) -> int:
        """Client rollouts open now."""
        return len(self._client_used)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._sessions
