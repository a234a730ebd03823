"""The data model every layer shares: sampling requests, engine results, LLM calls, trajectories.

This module is a leaf: it imports only the standard library and pydantic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

FinishReason = Literal["stop", "length", "abort"]
"""Why generation ended: a stop/EOS token, the token budget, or an abort (pause, shutdown)."""

TrajectoryStatus = Literal[
    "ok",
    "context_exceeded",
    "graph_error",
    "engine_error",
    "timeout",
]
"""How a rollout ended. Anything but ``ok`` carries ``Trajectory.error``."""

SegmentStart = Literal[
    "first_call",
    "new_conversation",
    "history_edited",
    "template_not_prefix_preserving",
    "node_changed",
]
"""Why the ledger started a new segment instead of extending an existing one."""


class SamplingParams(BaseModel):
    """How an engine samples one response.

    ``temperature == 0`` means greedy. Logprobs returned by engines are those of the sampled
    token under the distribution it was sampled from (temperature applied, top-k/top-p
    filtered); under greedy decoding they are the raw model logprobs.
    """

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(-1, description="Keep the k most likely tokens; -1 keeps all.")
    max_tokens: int = Field(256, ge=1, description="Most tokens generated for one call.")
    stop_token_ids: tuple[int, ...] = Field(
        (), description="Token ids that end generation (the engine's EOS ids are added)."
    )
    stop: tuple[str, ...] = Field(
        (),
        description="Strings that end generation once the decoded generated text contains one; "
        "the token completing it is kept as sampled (finish reason 'stop').",
    )
    seed: int | None = Field(None, description="Per-request seed for reproducible sampling.")
    adapter: str | None = Field(
        None,
        description="The named LoRA adapter that serves the request (several policies as "
        "adapters of one base, see `AdapterView`); None: the engine's own weights.",
    )


class GenerateResult(BaseModel):
    """What an engine returns for one request: token ids out, never text.

    ``policy_version`` is the version serving when the request finished. A request that
    outlived a weight update (paused, then resumed on new weights) also carries
    ``token_versions``: the version that sampled each token. `versions` reads either form.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    token_versions: list[int] | None = Field(
        None, description="Policy version of each token; None means all are policy_version."
    )

    @model_validator(mode="after")
    def _aligned(self) -> GenerateResult:
        n = len(self.token_ids)
        versions = n if self.token_versions is None else len(self.token_versions)
        if len(self.logprobs) != n or versions != n:
            raise ValueError(
                f"token_ids ({n}), logprobs ({len(self.logprobs)}) and token_versions "
                f"({None if self.token_versions is None else len(self.token_versions)}) "
                "must have the same length"
            )
        return self

    @property
    def versions(self) -> list[int]:
        """The policy version that sampled each token, aligned with ``token_ids``."""
        if self.token_versions is not None:
            return list(self.token_versions)
        return [self.policy_version] * len(self.token_ids)


class LLMCall(BaseModel):
    """One call of a chat model inside a rollout, exactly as the engine saw and answered it.

    The prompt is not copied into each call (that would be quadratic in turns): it is the
    first ``prompt_length`` tokens of the call's segment (the segment's prompt, then its
    response ids), which the ledger only ever appends to. `prompt_ids` reads them from the
    segment the call is attached to: the ledger attaches its calls, and a `Trajectory`
    attaches each call to ``segments[segment_index]`` (also after JSON). A call built with
    ``prompt_ids=[...]`` keeps that list as its own prompt.
    """

    node: str = Field(description="Graph node the call was made from.")
    policy: str = Field("default", description="Policy (set of weights) that serves the node.")
    turn: int = Field(description="How many calls this node made before this one in the rollout.")
    trained: bool = Field(description="False for calls made in @frozen nodes.")
    prompt_length: int = Field(
        ge=0, description="Tokens of the prompt sent to the engine: the first "
        "``prompt_length`` tokens of the call's segment (its prompt, then its response ids)."
    )
    forced_ids: list[int] = Field(
        default_factory=list, description="The end of ``prompt_ids`` the SDK wrote as the "
        "reply's opening to force a tool call (``tool_choice``); mask 0 in the segment."
    )
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    segment_index: int = Field(description="Index of the trajectory segment the call belongs to.")
    request_id: str
    _segment: Segment | None = PrivateAttr(None)

    @model_validator(mode="wrap")
    @classmethod
    def _own_prompt(cls, data: Any, handler: Any) -> LLMCall:
        # ``prompt_ids`` given (tests, JSON written before ``prompt_length``): kept as the
        # call's own one-call segment, so `prompt_ids` reads back exactly that list.
        prompt = data.get("prompt_ids") if isinstance(data, dict) else None
        if prompt is None:
            return handler(data)
        fields = {k: v for k, v in data.items() if k != "prompt_ids"}
        if fields.setdefault("prompt_length", len(prompt)) != len(prompt):
            raise ValueError(
                f"prompt_length {fields['prompt_length']} but {len(prompt)} prompt_ids given"
            )
        call = handler(fields)
        call._segment = Segment(node=call.node, prompt_ids=list(prompt))
        return call

    @property
    def prompt_ids(self) -> list[int]:
        """The full prompt sent to the engine (a new list, read from the call's segment).

        Raises:
            ValueError: The call is attached to no segment (see `attach`).
        """
        return self.prompt_slice(0, self.prompt_length)

    def prompt_slice(self, start: int, stop: int | None = None) -> list[int]:
        """``prompt_ids[start:stop]``, without building the whole prompt first."""
        segment = self._segment
        if segment is None:
            raise ValueError(
                f"LLMCall {self.request_id!r} is attached to no segment, so its prompt cannot "
                "be read: read calls from a Trajectory (it attaches each call to "
                "segments[segment_index]) or call attach(segment)"
            )
        stop = self.prompt_length if stop is None else min(stop, self.prompt_length)
        return segment.token_slice(start, stop)

    def attach(self, segment: Segment) -> None:
        """Read the prompt from ``segment``: its first ``prompt_length`` tokens."""
        self._segment = segment

    @property
    def attached(self) -> bool:
        """Whether the call has a segment to read its prompt from."""
        return self._segment is not None

    @property
    def segment(self) -> Segment | None:
        """The segment the call reads its prompt from (`attach`), if any."""
        return self._segment


_RESPONSE_FIELDS = ("response_ids", "response_mask", "response_logprobs", "response_versions")
"""A `Segment`'s per-response-token lists, aligned 1:1."""


class Segment(BaseModel):
    """One token sequence to train on: a prompt, then generated (mask 1) and observation (mask 0) tokens.

    ``response_logprobs`` and ``response_versions`` align 1:1 with ``response_ids``; at mask-0
    positions they hold 0.0 and -1 (nothing was sampled there).
    """

    node: str
    policy: str = "default"
    trained: bool = True
    started_because: SegmentStart = "first_call"
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    response_versions: list[int] = Field(default_factory=list)
    num_calls: int = 0

    @property
    def generated_ids(self) -> list[int]:
        """The mask-1 tokens, in order: exactly what the engine sampled for this segment."""
        return [t for t, m in zip(self.response_ids, self.response_mask, strict=True) if m]

    @property
    def length(self) -> int:
        """Prompt plus response tokens."""
        return len(self.prompt_ids) + len(self.response_ids)

    _base: tuple[Segment, int] | None = PrivateAttr(None)

    def branch(self) -> Segment:
        """A segment that goes on from this one as it is now and holds only what is appended
        to it (a tree rollout's continuation): the prompt list is this one's own object, the
        response so far is read from this one, which must not grow again. `whole` gives
        the full segment."""
        child = self.model_copy(update={**{k: [] for k in _RESPONSE_FIELDS}, "num_calls": 0})
        before = self._base[1] if self._base is not None else 0  # a branch of a branch
        child._base = (self, before + len(self.response_ids))
        return child

    def whole(self) -> Segment:
        """This segment with the tokens of the segment it branched from in front (a new
        segment sharing the prompt list); itself when it is no branch."""
        if self._base is None:
            return self
        base, length = self._base
        full = base.whole()
        whole = self.model_copy(update={
            **{k: getattr(full, k)[:length] + getattr(self, k) for k in _RESPONSE_FIELDS},
            "num_calls": full.num_calls + self.num_calls,
        })  # fmt: skip
        whole._base = None
        return whole

    @property
    def base(self) -> Segment | None:
        """The segment this one branched from (`branch`), or None."""
        return None if self._base is None else self._base[0]

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``(prompt_ids + response_ids)[start:stop]`` for ``0 <= start``, without the concatenation."""
        prompt = self.prompt_ids
        split = len(prompt)
        if stop <= split:
            return prompt[start:stop]
        if start >= split:
            return self.response_ids[start - split : stop - split]
        return prompt[start:] + self.response_ids[: stop - split]


EventKind = Literal["graph", "node", "llm", "engine", "tool", "reward"]
"""What a `RolloutEvent` times: the graph run, a node, a chat-model call, its engine call, a
tool, or a reward model's call (a judge) after the rollout."""


class RolloutEvent(BaseModel):
    """One timed step of a rollout, recorded for its trace (only when traces are on).

    Events form a tree through ``parent_id``; times are wall-clock nanoseconds since the epoch.
    """

    kind: EventKind
    name: str
    id: str = Field(description="Unique within the rollout (a LangChain run id).")
    parent_id: str | None = Field(None, description="The enclosing event's id; None at the top.")
    start_ns: int
    end_ns: int | None = None
    inputs: Any = None
    outputs: Any = None
    error: str | None = None
    call_index: int | None = Field(None, description="Index in `Trajectory.calls` (llm/engine).")


class RewardComponent(BaseModel):
    """One named reward and what it credits: a node (and one of its LLM calls), or everyone.

    A component crediting no node is part of the shared outcome every policy of the rollout
    earns; one crediting a node goes to that node's policy only (a node given as a graph path
    prefix credits the calls made under it). A trajectory keeps them in
    ``Trajectory.components``, typed on every path it travels (runner, gateway JSON, traces).
    """

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="What the reward is for (metrics are per name).")
    value: float = Field(description="Any finite real number: int, float, bool, numpy scalar.")
    node: str | None = Field(None, description="The node credited; None: the shared outcome.")
    step: int | None = Field(
        None, ge=0, description="The node's LLM call credited (its `LLMCall.turn`); None: all."
    )

    @field_validator("value", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> float:
        # Strings have no __float__, so "1" is refused while numpy/torch scalars pass.
        try:
            number = float(value) if hasattr(type(value), "__float__") else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(f"reward {value!r} is not a finite number")
        return number

    @model_validator(mode="after")
    def _step_needs_a_node(self) -> RewardComponent:
        if self.step is not None and self.node is None:
            raise ValueError(f"reward {self.name!r} credits step {self.step} but no node")
        return self

    def credits(self, node: str, turn: int | None = None) -> bool:
        """Whether this component credits calls of ``node`` (its ``turn``-th, when given)."""
        if self.node is None or not (node == self.node or node.startswith(self.node + "/")):
            return False
        return self.step is None or turn is None or self.step == turn


def totals_by_name(components: Iterable[RewardComponent]) -> dict[str, float]:
    """The sum of the components of each name, whatever they credit."""
    totals: dict[str, float] = {}
    for component in components:
        totals[component.name] = totals.get(component.name, 0.0) + component.value
    return totals


class Trajectory(BaseModel):
    """Everything one rollout of a graph on one dataset row produced."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    row_id: str
    sample_index: int = 0
    segments: list[Segment] = Field(default_factory=list)
    calls: list[LLMCall] = Field(default_factory=list)
    reward: float | None = None
    components: list[RewardComponent] = Field(
        default_factory=list, description="Every reward component, with what it credits: "
        "emitted by nodes, returned by the reward function, posted to the gateway, tool "
        "rewards and shaping penalties."
    )
    status: TrajectoryStatus = "ok"
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    events: list[RolloutEvent] = Field(
        default_factory=list, description="Timed nodes, LLM/engine calls and tools, for traces."
    )
    final_state: Any = Field(None, exclude=True, description="The graph's output state.")
    tree_path: list[int] | None = Field(
        None, description="A tree rollout's leaf: its tree, then the continuation it took at "
        "each branch point (rollout.tree); None for a rollout run from the start alone."
    )

    @model_validator(mode="after")
    def _attach_calls(self) -> Trajectory:
        # Calls read their prompts from their segments (after JSON, from these).
        for call in self.calls:
            if not call.attached and 0 <= call.segment_index < len(self.segments):
                call.attach(self.segments[call.segment_index])
        return self

    @property
    def trained_segments(self) -> list[Segment]:
        """Segments whose generated tokens should receive gradient."""
        return [s for s in self.segments if s.trained]

    @property
    def rewards(self) -> dict[str, float]:
        """Each component name's total (credited or shared): what metrics report per name."""
        return totals_by_name(self.components)


class Sample(BaseModel):
    """One trainable sequence: a trained segment or LLM call, its token advantages and weight.

    ``old_logprobs`` are the behaviour logprobs the engine recorded (0.0 at mask-0 positions);
    ``weight`` is the segment's share of its rollout (1 / trained segments of the rollout), so a
    rollout that made more calls does not count more.
    """

    row_id: str
    sample_index: int
    policy: str = "default"
    node: str = ""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    old_logprobs: list[float]
    response_versions: list[int] = Field(default_factory=list)
    token_advantages: list[float] = Field(
        description="One advantage per response token (an estimator's, see "
        "`agentrl_sdk.algorithms.estimators`): the one source of a sample's advantage."
    )
    reward: float = 0.0
    weight: float = 1.0
    values: list[float] = Field(
        default_factory=list, description="The critic's values the sample was scored with, "
        "aligned with response_ids (PPO with a critic); empty otherwise."
    )
    returns: list[float] = Field(
        default_factory=list, description="The critic's regression targets (GAE returns), "
        "aligned with response_ids; empty otherwise."
    )

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        n = len(self.response_ids)
        lengths = {k: len(getattr(self, k))
                   for k in ("response_mask", "old_logprobs", "token_advantages")}  # fmt: skip
        if any(m != n for m in lengths.values()):
            raise ValueError(f"response_ids ({n}) and {lengths} must have the same length")
        for name in ("values", "returns"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise ValueError(f"{name} ({len(getattr(self, name))}) must be empty or as "
                                 f"long as response_ids ({n})")
        return self

    @property
    def carries_signal(self) -> bool:
        """Whether some trained (mask-1) token has an advantage: the update has a gradient."""
        return any(a and m for a, m in zip(self.token_advantages, self.response_mask, strict=True))

    @property
    def advantage(self) -> float:
        """The one number traces show: the token advantages' mean over sampled (mask-1)
        tokens (over all tokens when none is sampled; 0.0 without tokens)."""
        adv = [a for a, m in zip(self.token_advantages, self.response_mask, strict=True) if m]
        adv = adv or self.token_advantages
        # A rollout's one advantage on every token comes back exactly, not via a rounded mean.
        return adv[0] if len(set(adv)) == 1 else math.fsum(adv) / len(adv) if adv else 0.0


class Batch(BaseModel):
    """The samples of one policy update."""

    step: int = 0
    policy: str = "default"
    samples: list[Sample] = Field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Prompt plus response tokens over all samples."""
        return sum(len(s.prompt_ids) + len(s.response_ids) for s in self.samples)
