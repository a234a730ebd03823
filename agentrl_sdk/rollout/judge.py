"""LLM-judge rewards (as ART's RULER): a judge model scores a row's rollouts against each other.

Scoring a group relatively is easier for a judge than an absolute score, and GRPO-style
advantages only use the differences within a group anyway. The judge is any LangChain chat
model; the rubric is a prompt. Its calls run outside every rollout's ledger (never trained on);
on traced rollouts each one shows as a ``reward`` span with its prompt, reply and score.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from agentrl_sdk.chat.context import current_node, current_recorder
from agentrl_sdk.types import RolloutEvent, Trajectory

__all__ = ["GroupReward", "Judge", "judge"]

JUDGE_INSTRUCTIONS = (
    "You are a strict judge. You see one task and several attempts at it. Score every attempt "
    "from 0 to 1 against the others and the rubric: the best attempt gets the highest score, "
    "equally good attempts get equal scores.\n\nRubric:\n{rubric}\n\nReply with only a JSON "
    'object, one number per attempt in order: {{"scores": [s1, s2, ...]}}'
)


@runtime_checkable
class GroupReward(Protocol):
    """A reward that scores all rollouts of one dataset row at once (the pipelines call it
    once per row with the rollouts that finished; failed ones get ``failed_rollout_reward``)."""

    async def score_group(
        self, states: Sequence[Any], row: Mapping[str, Any], trajectories: Sequence[Trajectory]
    ) -> list[float | Mapping[str, float]]:
        """One reward per trajectory, in order."""
        ...


class Judge:
    """A reward that has ``model`` score each row's rollouts against each other.

    Pass it as the ``reward`` of ``sdk.train`` / ``sdk.evaluate`` (``sdk.rewards.judge(model,
    rubric)``). Each rollout gets the component ``name`` (0 to 1). A judge that fails, times out
    or answers without a usable list of scores makes that row's rollouts counted reward errors
    (``reward.on_error``).

    Args:
        model: Any LangChain chat model; a frozen local one is a `TokenChatModel` with its own
            ``engine`` and ``tokenizer``.
        task: Row -> the task as the judge reads it (default: the row's last user message).
        answer: (final state, trajectory) -> an attempt as the judge reads it (default: the
            last AI message's text).
    """

    def __init__(
        self,
        model: BaseChatModel,
        rubric: str,
        *,
        name: str = "judge",
        task: Callable[[Mapping[str, Any]], str] | None = None,
        answer: Callable[[Any, Trajectory], str] | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.model, self.rubric, self.name, self.timeout_s = model, rubric, name, timeout_s
        self.task = task or default_task
        self.answer = answer or default_answer

    def prompt(self, states: Sequence[Any], row: Mapping[str, Any],
               trajectories: Sequence[Trajectory]) -> list[BaseMessage]:
        """The judge's conversation: the rubric, the task and every attempt, numbered."""
        attempts = "\n\n".join(
            f"Attempt {i}:\n{self.answer(state, traj)}"
            for i, (state, traj) in enumerate(zip(states, trajectories, strict=True), start=1)
        )
        return [SystemMessage(JUDGE_INSTRUCTIONS.format(rubric=self.rubric)),
                HumanMessage(f"Task:\n{self.task(row)}\n\n{attempts}")]

    async def score_group(
        self, states: Sequence[Any], row: Mapping[str, Any], trajectories: Sequence[Trajectory]
    ) -> list[float | Mapping[str, float]]:
        """Ask the judge once for the group.

        Raises:
            TimeoutError: The judge did not answer within ``timeout_s``.
            ValueError: Its reply holds no list of one score per attempt.
        """
        messages = self.prompt(states, row, trajectories)
        start = time.time_ns()
        reply: AIMessage | None = None
        try:
            # Outside any rollout's ledger whatever the caller's context: never trained on.
            recorder, node = current_recorder.set(None), current_node.set(None)
            try:
                reply = await asyncio.wait_for(self.model.ainvoke(messages), self.timeout_s)
            finally:
                current_node.reset(node)
                current_recorder.reset(recorder)
            scores = parse_scores(reply.text, len(trajectories))
        except Exception as exc:
            _trace(trajectories, self.name, messages, reply, None, start, exc)
            raise
        _trace(trajectories, self.name, messages, reply, scores, start, None)
        return [{self.name: s} for s in scores]


judge = Judge
"""``sdk.rewards.judge(model, rubric, ...)``: a `Judge`."""


def default_task(row: Mapping[str, Any]) -> str:
    """The row's last user message (``messages`` or verl's ``prompt``), else the row as JSON."""
    for key in ("messages", "prompt"):
        users = [m for m in row.get(key) or [] if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content", ""))
    return json.dumps(dict(row), default=str)


def default_answer(state: Any, trajectory: Trajectory) -> str:
    """The final state's last AI message text, else the final state as text."""
    messages = state.get("messages") if isinstance(state, Mapping) else None
    for message in reversed(messages or []):
        if isinstance(message, AIMessage):
            return message.text
    return str(state)


def parse_scores(text: str, count: int) -> list[float]:
    """The first ``{"scores": [...]}`` object in ``text`` as ``count`` numbers clipped to [0, 1]
    (text around it, such as a small model's trailing braces or chatter, is ignored).

    Raises:
        ValueError: No such object, or not ``count`` finite numbers.
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            found, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            found = None
        scores = found.get("scores") if isinstance(found, dict) else None
        if (isinstance(scores, list) and len(scores) == count
                and all(isinstance(s, int | float) and math.isfinite(s) for s in scores)):
            return [min(1.0, max(0.0, float(s))) for s in scores]
        start = text.find("{", start + 1)
    raise ValueError(f'the judge gave no {{"scores": [...]}} with {count} numbers: {text[:200]!r}')


def _trace(trajectories: Sequence[Trajectory], name: str, messages: list[BaseMessage],
           reply: AIMessage | None, scores: list[float] | None, start_ns: int,
           error: BaseException | None) -> None:
    """A ``reward`` span on every traced trajectory of the group: prompt, reply, its score."""
    prompt = [{"role": m.type, "content": m.text} for m in messages]
    for index, traj in enumerate(trajectories):
        if not traj.events:
            continue
        traj.events.append(RolloutEvent(
            kind="reward", name=f"judge · {name}", id=f"judge-{uuid.uuid4().hex[:12]}",
            start_ns=start_ns, end_ns=time.time_ns(), inputs={"messages": prompt},
            outputs={"reply": reply.text if reply is not None else None,
                     "score": scores[index] if scores is not None else None,
                     "attempt": index + 1},
            error=f"{type(error).__name__}: {error}" if error is not None else None,
        ))
