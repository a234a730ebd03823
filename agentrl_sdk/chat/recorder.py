"""`RolloutRecorder`: the per-rollout side of every LLM call — ledger, engine routing, counters."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.attribution import NodeTag, attribute
from agentrl_sdk.chat.events import EventLog
from agentrl_sdk.chat.ledger import PromptPlan, TokenLedger
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import ChatConfig, NodeRule, RolloutConfig
from agentrl_sdk.engines.user_engines import fit_engine, fit_engines
from agentrl_sdk.errors import ContextBudgetExceeded, EngineError
from agentrl_sdk.types import (
    GenerateResult,
    LLMCall,
    RewardComponent,
    RolloutEvent,
    SamplingParams,
    Trajectory,
    TrajectoryStatus,
)

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine


@dataclass(frozen=True)
class PendingCall:
    """An engine answer not yet recorded: the chat model builds the reply message first."""

    plan: PromptPlan
    result: GenerateResult
    request_id: str
    started_ns: int = 0
    ended_ns: int = 0


class SharedEngine(Mapping[str, "Engine"]):
    """One engine serving every policy: the engine-by-policy mapping of a one-model setup.

    Whatever policy a node names, ``shared[policy]`` is the engine, so callers index engines
    by policy the same way whether one model serves everything or each policy has its own.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __getitem__(self, policy: str) -> Engine:
        return self.engine

    def __iter__(self) -> Iterator[str]:
        return iter(("*",))

    def __len__(self) -> int:
        return 1


def engines_by_policy(engines: Engine | Mapping[str, Engine]) -> Mapping[str, Engine]:
    """``engines`` as a mapping by policy: a single engine serves every policy. Engines
    users wrote are fitted to the call made here (`fit_engine`)."""
    if isinstance(engines, SharedEngine):
        return SharedEngine(fit_engine(engines.engine))
    return fit_engines(engines) if isinstance(engines, Mapping) else SharedEngine(
        fit_engine(engines))


class RolloutRecorder:
    """Everything one rollout's LLM calls share.

    Args:
        engines: The engine serving each policy; a single engine serves every policy.
        rollout_id: Prefix of engine request ids, unique per rollout.
        default_trainable: Whether calls from undecorated nodes no rule matches are trained.
        node_rules: Attribution of undecorated nodes by path pattern (see `attribute`).
        events: Where timed events go when the rollout is traced; None records nothing.
    """

    def __init__(
        self,
        engines: Engine | Mapping[str, Engine],
        template: ChatTemplate,
        *,
        chat: ChatConfig | None = None,
        sampling: SamplingParams | None = None,
        rollout_id: str = "rollout",
        default_trainable: bool = True,
        node_rules: Mapping[str, NodeRule] | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.engines = engines_by_policy(engines)
        self.template = template
        self.chat = chat or ChatConfig()
        self.sampling = sampling or SamplingParams()
        self.rollout_id = rollout_id
        self.default_trainable = default_trainable
        self.node_rules = dict(node_rules or {})
        self.events = events
        self.ledger = TokenLedger(template)
        self.metrics: Counter[str] = Counter()
        self.components: list[RewardComponent] = []
        """Reward components emitted during the rollout (and posted to the gateway)."""
        self._clipped: dict[str, str] = {}
        self._request_numbers = itertools.count()
        self._trunk_events: list[RolloutEvent] = []

    @classmethod
    def for_rollout(
        cls, engines: Engine | Mapping[str, Engine], template: ChatTemplate,
        config: RolloutConfig, rollout_id: str, *, record_events: bool,
    ) -> RolloutRecorder:
        """The recorder of rollout ``rollout_id`` run with the settings of ``config``
        (traced into a fresh `EventLog` when ``record_events``)."""
        return cls(
            engines, template, chat=config.chat, sampling=config.sampling,
            rollout_id=rollout_id, default_trainable=config.default_trainable,
            node_rules=config.nodes, events=EventLog() if record_events else None,
        )  # fmt: skip

    def fork(self, rollout_id: str, *, carry_counters: bool) -> RolloutRecorder:
        """A recorder that goes on from this one's calls as rollout ``rollout_id`` (a tree
        rollout's continuation): its ledger forks (`TokenLedger.fork`), the reward components
        and traced events so far are its too. Counters start from this one's when
        ``carry_counters`` (one continuation carries the trunk's, so a tree's add up to the
        work done), else from zero. This recorder must record nothing more."""
        child = RolloutRecorder(
            self.engines, self.template, chat=self.chat, sampling=self.sampling,
            rollout_id=rollout_id, default_trainable=self.default_trainable,
            node_rules=self.node_rules, events=EventLog() if self.events is not None else None,
        )  # fmt: skip
        child.ledger = self.ledger.fork()
        child.components = list(self.components)
        child._clipped = self._clipped
        if carry_counters:
            child.metrics = Counter(self.metrics)
        if self.events is not None:
            child._trunk_events = self._trunk_events + self.events.finish()
        return child

    def engine_for(self, policy: str) -> Engine:
        """The engine that serves ``policy``."""
        try:
            return self.engines[policy]
        except KeyError:
            raise KeyError(
                f"no engine serves policy {policy!r}; known policies: {sorted(self.engines)}"
            ) from None

    def node_at(self, path: str | None) -> NodeTag:
        """The attribution of a call from the undecorated node at graph ``path``."""
        return attribute(path, self.node_rules, default_trainable=self.default_trainable)

    def clip_observation(self, text: str) -> str:
        """Cut a tool output to ``chat.max_observation_tokens`` tokens (counted once per text)."""
        limit = self.chat.max_observation_tokens
        if limit is None:
            return text
        if text not in self._clipped:
            ids = self.template.encode(text)
            clipped = text
            if len(ids) > limit:
                clipped = (
                    self.template.decode(ids[:limit])
                    + f"\n[truncated: {len(ids) - limit} more tokens]"
                )
                self.metrics["observations_truncated"] += 1
            self._clipped[text] = clipped
        return self._clipped[text]

    async def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        node: NodeTag,
        overrides: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        forced_ids: list[int] | None = None,
    ) -> PendingCall:
        """Plan the prompt with the ledger and ask the policy's engine for a response.

        ``timeout_s`` replaces ``chat.request_timeout_s`` for this call. ``forced_ids`` open
        the reply: the engine continues after them, and the ledger keeps them at mask 0.

        Raises:
            ContextBudgetExceeded: the prompt leaves no room for one generated token.
            EngineError: the engine failed or did not answer within the timeout.
        """
        plan = self.ledger.plan(messages, tools, node)
        if forced_ids:
            plan = dataclasses.replace(plan, forced_ids=list(forced_ids))
        budget = self.chat.max_context_tokens
        room = budget - len(plan.engine_prompt)
        if room < 1:
            self.ledger.release(plan)
            self.metrics["context_exceeded"] += 1
            raise ContextBudgetExceeded(len(plan.engine_prompt), budget, node.name)
        sampling = self.sampling.model_copy(update=dict(overrides))
        request_id = f"{self.rollout_id}-{next(self._request_numbers)}"
        update: dict[str, Any] = {"max_tokens": min(sampling.max_tokens, room)}
        if sampling.seed is not None:
            # One seed per request: samples of a row differ, yet a rerun repeats them exactly.
            update["seed"] = zlib.crc32(f"{sampling.seed}:{request_id}".encode())
        sampling = sampling.model_copy(update=update)
        timeout = self.chat.request_timeout_s if timeout_s is None else timeout_s
        started_ns = time.time_ns()
        try:
            async with asyncio.timeout(timeout):  # no task of its own, unlike wait_for
                result = await self.engine_for(node.policy).generate(
                    plan.engine_prompt, sampling, request_id, session_id=self.rollout_id
                )
        except TimeoutError as exc:
            self.ledger.release(plan)
            self.metrics["engine_timeouts"] += 1
            raise EngineError(
                f"engine gave no answer to {request_id} within {timeout}s"
            ) from exc
        except BaseException:
            self.ledger.release(plan)
            raise
        return PendingCall(plan, result, request_id, started_ns, time.time_ns())

    def commit(
        self, pending: PendingCall, reply: dict[str, Any], llm_run_id: Any = None
    ) -> LLMCall:
        """Record the call in the ledger and count it (and time it, when traced).

        ``llm_run_id`` is the LangChain run id of the chat-model call, to nest the engine call
        under it in the trace.
        """
        plan, result = pending.plan, pending.result
        self.metrics["llm_calls"] += 1
        self.metrics["generated_tokens"] += len(result.token_ids)
        if plan.segment_index is None:
            self.metrics[f"segments_started.{plan.start_reason or 'first_call'}"] += 1
        call = self.ledger.commit(plan, result, reply, pending.request_id)
        if self.events is not None:
            self.events.engine_call(
                llm_run_id, len(self.ledger.calls) - 1, pending.started_ns, pending.ended_ns,
                name=f"engine.generate[{plan.node.policy}]",
            )
        return call

    def trajectory(
        self, row_id: str, sample_index: int, status: TrajectoryStatus = "ok",
        error: str | None = None, final_state: Any = None,
    ) -> Trajectory:
        """The rollout as the pipeline trains on it: the ledger's segments and calls, the
        rewards and counters, and the events (closed now) when it was traced."""
        segments, calls = self.ledger.settled()
        return Trajectory(
            row_id=row_id,
            sample_index=sample_index,
            segments=segments,
            calls=calls,
            status=status,
            error=error,
            components=list(self.components),
            metrics={k: float(v) for k, v in self.metrics.items()},
            events=self._trunk_events + self.events.finish() if self.events is not None else [],
            final_state=final_state,
        )
