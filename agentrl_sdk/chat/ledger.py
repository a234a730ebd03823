"""The token ledger: the exact ids of every call in a rollout, arranged into trainable segments.

A call whose messages extend an earlier call's messages (plus that call's reply) reuses the
earlier prompt and *generated* ids as its prefix and templates only the new messages. So the
tokens trained on are the tokens sampled, even when the template would re-render the reply
differently (compact JSON, stripped whitespace). When the history does not extend, or the
template would rewrite it, the ledger starts a new segment and records why.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentrl_sdk.chat.attribution import NodeTag
from agentrl_sdk.chat.delta import HistoryCheck
from agentrl_sdk.chat.messages import tools_key
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.types import GenerateResult, LLMCall, Segment, SegmentStart


@dataclass
class _Conversation:
    """What a segment's last call saw, plus its reply: the prefix a follow-up must extend."""

    node: NodeTag
    messages: list[dict[str, Any]]
    tools_key: str
    busy: bool = False
    check: HistoryCheck = field(default_factory=HistoryCheck)


@dataclass(frozen=True)
class PromptPlan:
    """How the next call's prompt is built: extend a segment, or start one and say why."""

    node: NodeTag
    messages: list[dict[str, Any]]
    tools_key: str
    prompt_ids: list[int]
    segment_index: int | None = None
    observation_ids: list[int] = field(default_factory=list)
    start_reason: SegmentStart | None = None
    forced_ids: list[int] = field(default_factory=list)

    @property
    def engine_prompt(self) -> list[int]:
        """What the engine continues: the prompt, then the reply's forced opening (if any)."""
        return self.prompt_ids + self.forced_ids if self.forced_ids else self.prompt_ids


class TokenLedger:
    """Segments and calls of one rollout. Not thread-safe; one rollout runs on one event loop."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.segments: list[Segment] = []
        self.calls: list[LLMCall] = []
        self._conversations: list[_Conversation] = []
        self._turns: Counter[str] = Counter()
        self._own: set[int] = set()  # segments this ledger may append to (not a parent's)

    def fork(self) -> TokenLedger:
        """A ledger that goes on from this one's calls (a tree rollout's continuation).

        It holds this one's segments and calls themselves, not copies of their ids; the first
        call that extends one of them turns it into a branch of it (`Segment.branch`) that
        records only the new tokens. This ledger must record nothing more.
        """
        child = TokenLedger(self.template)
        child.segments, child.calls = list(self.segments), list(self.calls)
        child._conversations = [
            dataclasses.replace(c, messages=list(c.messages), check=copy.copy(c.check))
            for c in self._conversations
        ]
        child._turns = Counter(self._turns)
        return child

    def settled(self) -> tuple[list[Segment], list[LLMCall]]:
        """The segments whole (`Segment.whole`: a branch with its trunk's tokens in front) and
        the calls, each attached to its whole segment: what a `Trajectory` holds."""
        segments = [s.whole() for s in self.segments]
        for call in self.calls:
            if call.segment is not None and call.segment.base is not None:
                call.attach(segments[call.segment_index])
        return segments, self.calls

    def plan(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, node: NodeTag
    ) -> PromptPlan:
        """Decide the prompt ids for a call with ``messages`` and ``tools`` from ``node``.

        The segment it extends (if any) is reserved until `commit` or `release`, so two
        concurrent calls never extend the same segment.
        """
        key = tools_key(tools)
        index, reason = self._find_extension(messages, node)
        if index is not None:
            conv = self._conversations[index]
            # The text the template adds for the new messages (None: it rewrites history),
            # rendered from a window of the history checked against full renders
            # (`agentrl_sdk.chat.delta`): a full render's text at the new messages' cost.
            delta = (self.template.deltas.delta(conv.messages, messages, tools, conv.check)
                     if key == conv.tools_key else None)
            if delta is not None:
                segment = self.segments[index].whole()
                closing = self.template.closing_text(segment.response_ids)
                observation = self.template.encode(closing + delta)
                conv.busy = True
                prompt = segment.prompt_ids + segment.response_ids + observation
                return PromptPlan(node, messages, key, prompt, segment_index=index,
                                  observation_ids=observation)
            reason = "template_not_prefix_preserving"
        text = self.template.render(messages, tools, add_generation_prompt=True)
        return PromptPlan(node, messages, key, self.template.encode(text), start_reason=reason)

    def commit(
        self, plan: PromptPlan, result: GenerateResult, reply: dict[str, Any], request_id: str
    ) -> LLMCall:
        """Record the engine's answer to ``plan`` and the reply message built from it."""
        if plan.segment_index is None:
            segment = Segment(
                node=plan.node.name,
                policy=plan.node.policy,
                trained=plan.node.trained,
                started_because=plan.start_reason or "first_call",
                prompt_ids=list(plan.prompt_ids),
            )
            self.segments.append(segment)
            self._conversations.append(_Conversation(plan.node, [], plan.tools_key))
            index = len(self.segments) - 1
            self._own.add(index)
        else:
            index = plan.segment_index
            if index not in self._own:  # a forked parent's: go on in a branch of it
                self.segments[index] = self.segments[index].branch()
                self._own.add(index)
            segment = self.segments[index]
        # Observations and a forced reply opening were not sampled: mask 0.
        _append(segment, plan.observation_ids + plan.forced_ids, mask=0, logprobs=None,
                version=-1)
        _append(segment, result.token_ids, mask=1, logprobs=result.logprobs,
                version=result.versions)
        segment.num_calls += 1
        conv = self._conversations[index]
        conv.messages = [*plan.messages, reply]
        conv.tools_key = plan.tools_key
        conv.busy = False
        # The call's prompt is the segment's first tokens: stored as their count, not copied.
        call = LLMCall(
            node=plan.node.name,
            policy=plan.node.policy,
            turn=self._turns[plan.node.name],
            trained=plan.node.trained,
            prompt_length=len(plan.prompt_ids) + len(plan.forced_ids),
            forced_ids=list(plan.forced_ids),
            response_ids=list(result.token_ids),
            response_logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
            policy_version=result.policy_version,
            segment_index=index,
            request_id=request_id,
        )
        call.attach(segment)
        self._turns[plan.node.name] += 1
        self.calls.append(call)
        return call

    def release(self, plan: PromptPlan) -> None:
        """Give back a segment reserved by `plan` when the call failed."""
        if plan.segment_index is not None:
            self._conversations[plan.segment_index].busy = False

    def _find_extension(
        self, messages: list[dict[str, Any]], node: NodeTag
    ) -> tuple[int | None, SegmentStart]:
        """The newest segment whose conversation ``messages`` extends, else why there is none."""
        edited = False
        for index in reversed(range(len(self._conversations))):
            conv = self._conversations[index]
            seen = conv.messages
            if conv.busy:
                continue
            if len(messages) > len(seen) and messages[: len(seen)] == seen:
                if conv.node != node:
                    return None, "node_changed"
                return index, "first_call"
            # The earlier prompt is still there but the reply after it is not ours (edited,
            # or dropped and something else in its place): whatever comes after it.
            if (conv.node == node and len(messages) >= len(seen)
                    and messages[: len(seen) - 1] == seen[:-1]):
                edited = True
        if edited:
            return None, "history_edited"
        return None, "new_conversation" if self.segments else "first_call"


def _append(
    segment: Segment,
    ids: list[int],
    *,
    mask: int,
    logprobs: list[float] | None,
    version: int | list[int],
) -> None:
    segment.response_ids.extend(ids)
    segment.response_mask.extend([mask] * len(ids))
    segment.response_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
    # A resumed request's tokens may come from several policy versions, one per token.
    segment.response_versions.extend(version if isinstance(version, list) else [version] * len(ids))
