"""`TraceRecord`: one MLflow trace read as training data — its token ledger, reward and identity.

A record holds what the trace holds, as data: the request's input and output, the feedback
attached to it, and, for a trace this SDK wrote, every LLM call's exact prompt ids, sampled ids,
logprobs and policy version, with the identity of the tokenizer those ids came from. Nothing
in a record is ever executed or evaluated: strings stay strings.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl_sdk.identity import TokenizerIdentity
from agentrl_sdk.types import FinishReason, LLMCall, Segment, Trajectory

__all__ = ["TraceRecord", "TracedCall"]


class TracedCall(BaseModel):
    """One LLM call of a traced request, exactly as the engine saw and answered it."""

    model_config = ConfigDict(frozen=True)

    node: str = Field(description="Graph node (path) the call was made from.")
    policy: str = "default"
    turn: int = Field(description="How many calls the node made before this one.")
    trained: bool = Field(description="False for calls of ``@frozen`` nodes.")
    prompt_ids: list[int] = Field(description="The full prompt sent to the engine.")
    response_ids: list[int] = Field(description="The ids the engine sampled.")
    response_logprobs: list[float] = Field(description="Their behaviour logprobs.")
    policy_version: int = Field(description="The weights version that served the call.")
    finish_reason: FinishReason
    segment_index: int = Field(description="The ledger segment the call extends.")
    segment_offset: int = Field(
        description="Where the call's response starts in its segment's response ids."
    )


class TraceRecord(BaseModel):
    """One selected trace: what was asked, what came back, the reward, and the token ledger.

    ``segments`` and ``calls`` are empty for a trace that holds no ledger (a trace written by
    another tool, e.g. MLflow's LangChain autologging): such a record can still be replayed as
    a prompt (`TraceSelection.rows`) but not trained on token for token.
    """

    trace_id: str
    experiment_id: str
    timestamp_ms: int = Field(description="When the request started (ms since the epoch).")
    tags: dict[str, str] = Field(default_factory=dict)
    inputs: Any = Field(None, description="The request: the graph's input for a rollout or "
                        "served request traced by this SDK, the root span's inputs otherwise.")
    outputs: Any = Field(None, description="The root span's outputs.")
    feedback: dict[str, Any] = Field(
        default_factory=dict, description="The latest valid value of each feedback name.")
    expectations: dict[str, Any] = Field(
        default_factory=dict, description="The latest value of each expectation (ground truth).")
    reward: float | None = Field(None, description="The reward read for training (`traces`).")
    tokenizer: TokenizerIdentity | None = Field(
        None, description="The tokenizer the ledger's ids came from; None: not recorded.")
    segments: list[Segment] = Field(default_factory=list, description="The token ledger.")
    calls: list[TracedCall] = Field(default_factory=list, description="Its LLM calls, in order.")

    @property
    def has_ledger(self) -> bool:
        """Whether the trace holds token ids to train on."""
        return bool(self.segments)

    @property
    def policy_versions(self) -> list[int]:
        """The weights versions that served the request's calls, ascending."""
        return sorted({c.policy_version for c in self.calls})

    def trajectory(self, row_id: str | None = None) -> Trajectory:
        """The trace as a `Trajectory`: the traced segments and calls, the reward, ids as
        recorded (the path every trainer input takes: credit, samples, advantages).

        Args:
            row_id: The trajectory's ``row_id`` (what advantages group by); the trace id when
                None.
        """
        segments = [s.model_copy(deep=True) for s in self.segments]
        calls = [
            LLMCall(**c.model_dump(exclude={"prompt_ids", "segment_offset"}),
                    prompt_length=len(segments[c.segment_index].prompt_ids) + c.segment_offset,
                    request_id=f"{self.trace_id}-{i}")
            for i, c in enumerate(self.calls)
        ]
        return Trajectory(row_id=row_id or self.trace_id, segments=segments, calls=calls,
                          reward=self.reward)
