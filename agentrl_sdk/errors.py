"""The SDK's own exceptions; backend errors are mapped to these at one boundary each."""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error the SDK raises on purpose."""


class ContextBudgetExceeded(AgentRLError):
    """A call's prompt would not leave room for even one generated token.

    Raised by the chat model; the rollout ends with status ``context_exceeded``.
    """

    def __init__(self, prompt_tokens: int, budget: int, node: str | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.budget = budget
        self.node = node
        where = f" in node {node!r}" if node else ""
        super().__init__(
            f"prompt of {prompt_tokens} tokens{where} leaves no room to generate within the "
            f"context budget of {budget} tokens; raise max_context_tokens or shorten the history"
        )


class EngineError(AgentRLError):
    """The inference engine failed or did not answer in time."""


class NoEngineError(AgentRLError):
    """A chat model was called outside a rollout and has no engine of its own."""


class TrackingError(AgentRLError):
    """The MLflow run could not be opened (the tracking URI is unreachable or refuses it).

    Raised before any engine or trainer starts; once a run is open, tracking failures are
    buffered, retried and counted instead (``tracking/failed_writes``), never raised.
    """


class CheckpointError(AgentRLError):
    """A checkpoint cannot be resumed from: incomplete, or its parts disagree."""


class TraceMismatchError(AgentRLError):
    """Traced token ids were made by another tokenizer than the one of the model being trained
    (or by an unknown one): training on them would be wrong, and retokenizing them would not be
    what the model sampled, so they are refused."""
