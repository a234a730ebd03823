"""Fine-tuning on the best traces (rejection sampling): the best-rated traces as supervised
examples, token for token where the ids are exact, retokenized from their messages where they
are not (another model's traces: distillation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import convert_to_messages

from agentrl_sdk.chat.messages import to_template_message
from agentrl_sdk.identity import tokenizer_identity
from agentrl_sdk.production.records import TraceRecord
from agentrl_sdk.production.replay import chat_messages
from agentrl_sdk.production.tokens import token_problem, training_batch

__all__ = [
    "FinetuneResult", "Retokenize", "SftExamples", "best_records", "sft_examples",
]

Retokenize = Literal["auto", "never", "always"]
"""When a trace's messages are tokenized again: ``auto`` for traces whose ids are not exact
under the tokenizer (another vocabulary, no ledger), ``never`` (those are left out), or
``always`` (even traces with exact ids)."""

Example = tuple[list[int], list[int]]


@dataclass
class SftExamples:
    """Supervised examples of traces, ``(input_ids, loss_mask)``, and how each was made.

    Attributes:
        examples: The examples, exact ones first.
        exact: Traces trained on their traced ids (the mask as traced: 1 on sampled tokens).
        retokenized: Traces whose messages were rendered and tokenized with the tokenizer.
        left_out: Trace ids per reason none was made (``not_exact``: ids not exact and
            ``retokenize="never"``; ``no_conversation``: no assistant message to learn).
    """

    examples: list[Example] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    retokenized: list[str] = field(default_factory=list)
    left_out: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class FinetuneResult:
    """What `sdk.finetune_on_traces` trained and wrote.

    Attributes:
        final_model: The fine-tuned ``save_pretrained`` folder.
        losses: The loss of every optimizer step.
        exact: Traces learned token for token.
        retokenized: Traces learned from their retokenized conversation.
        left_out: Trace ids per reason they gave no example.
        learned_tokens: Tokens with loss over all examples (each counted once).
    """

    final_model: str
    losses: list[float]
    exact: list[str]
    retokenized: list[str]
    left_out: dict[str, list[str]]
    learned_tokens: int = 0


def best_records(
    records: Sequence[TraceRecord],
    *,
    min_reward: float | None = None,
    top_fraction: float | None = None,
) -> list[TraceRecord]:
    """The records with a reward of at least ``min_reward``, then the best ``top_fraction``
    of those (at least one; ties kept in the records' order).

    Raises:
        ValueError: ``top_fraction`` outside (0, 1], or a record without a reward.
    """
    if top_fraction is not None and not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if unscored := [r.trace_id for r in records if r.reward is None]:
        raise ValueError(f"{len(unscored)} trace(s) have no reward (e.g. {unscored[0]}): "
                         "select them with sdk.traces(..., reward=...)")
    kept = [r for r in records if min_reward is None or r.reward >= min_reward]  # type: ignore[operator]
    if top_fraction is not None and kept:
        count = max(1, math.floor(len(kept) * top_fraction))
        kept = sorted(kept, key=lambda r: -r.reward)[:count]  # type: ignore[operator]
    return kept


def sft_examples(
    records: Sequence[TraceRecord], tokenizer: Any, *, retokenize: Retokenize = "auto"
) -> SftExamples:
    """``records`` as supervised examples for the model of ``tokenizer``.

    A trace whose ids are exact under ``tokenizer`` (`TraceSelection.exact`) gives its
    trained segments: the traced prompt and response ids, loss on the sampled tokens only.
    Any other trace, with ``retokenize`` ``auto`` or ``always``, gives its conversation (the
    output state's chat messages) rendered with ``tokenizer``'s chat template, loss on the
    assistant turns (`build_sft_examples`): the ids are then the tokenizer's, not the ones
    that were served.
    """
    # Imported here: the warm start's training stack is not loaded with the package.
    from agentrl_sdk.models.warm_start import build_sft_examples

    out = SftExamples()
    expected = tokenizer_identity(tokenizer)
    exact = [r for r in records if retokenize != "always" and token_problem(r, expected) is None]
    if exact:
        samples, _ = training_batch(exact, tokenizer)
        out.examples += [(s.prompt_ids + s.response_ids,
                          [0] * len(s.prompt_ids) + list(s.response_mask)) for s in samples]
        out.exact = [r.trace_id for r in exact]
    for record in records:
        if record in exact:
            continue
        if retokenize == "never":
            out.left_out.setdefault("not_exact", []).append(record.trace_id)
            continue
        messages = _conversation(record)
        if messages is None:
            out.left_out.setdefault("no_conversation", []).append(record.trace_id)
            continue
        out.examples += build_sft_examples(tokenizer, messages)
        out.retokenized.append(record.trace_id)
    return out


def _conversation(record: TraceRecord) -> list[dict[str, Any]] | None:
    """The trace's output state's messages (the whole conversation of a ``MessagesState``
    graph) as a chat template renders them, or None without an assistant message. LangChain's
    own conversion reads them (serialized messages and OpenAI-style dicts alike): content
    stays text, nothing in it is evaluated."""
    outputs = record.outputs
    messages = outputs.get("messages") if isinstance(outputs, dict) else None
    if not isinstance(messages, list) or chat_messages(messages) is None:
        return None
    try:
        chat = [to_template_message(m) for m in convert_to_messages(messages)]
    except (ValueError, TypeError, NotImplementedError):
        return None
    return chat if any(m["role"] == "assistant" for m in chat) else None
