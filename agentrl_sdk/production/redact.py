"""The redact hook: what a trace may carry into training, decided before anything else reads it.

`traces` calls the hook on every record right after reading it, before the reward function,
a judge, replayed rows or training samples see it. A hook returns the record (edited, e.g.
with ``model_copy(update=...)``) or None to drop the trace (counted as ``redacted``).

Editing text does not edit token ids: the ledger holds the tokens the model produced. To keep
a pattern out of token training, drop the traces whose tokens hold it (`drop_matching`);
`redact_text` is for the text that replayed prompts and reward functions read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from agentrl_sdk.production.records import TraceRecord

__all__ = ["Redact", "drop_matching", "redact_text"]

Redact = Callable[[TraceRecord], TraceRecord | None]
"""A redact hook: the record to keep (possibly edited), or None to drop the trace."""


def redact_text(
    patterns: Iterable[str | re.Pattern[str]], replacement: str = "[redacted]"
) -> Redact:
    """A hook that replaces every match of ``patterns`` in the record's inputs, outputs,
    feedback and expectations (every string, however nested) with ``replacement``.

    Token ids are left as they are (see the module's note): combine with `drop_matching` when
    the records are trained on token for token.
    """
    compiled = [re.compile(p) if isinstance(p, str) else p for p in patterns]

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            for pattern in compiled:
                value = pattern.sub(replacement, value)
            return value
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [scrub(v) for v in value]
        return value

    def hook(record: TraceRecord) -> TraceRecord:
        return record.model_copy(update={
            name: scrub(getattr(record, name))
            for name in ("inputs", "outputs", "feedback", "expectations")
        })

    return hook


def drop_matching(patterns: Iterable[str | re.Pattern[str]], tokenizer: Any) -> Redact:
    """A hook that drops a trace when a pattern matches its text: its inputs and outputs, or
    its token ledger decoded with ``tokenizer`` (the one the trace was served with)."""
    compiled = [re.compile(p) if isinstance(p, str) else p for p in patterns]

    def texts(record: TraceRecord) -> Iterable[str]:
        yield from _strings(record.inputs)
        yield from _strings(record.outputs)
        for seg in record.segments:
            yield tokenizer.decode(seg.prompt_ids + seg.response_ids)

    def hook(record: TraceRecord) -> TraceRecord | None:
        for text in texts(record):
            if any(p.search(text) for p in compiled):
                return None
        return record

    return hook


def _strings(value: Any) -> Iterable[str]:
    """Every string in ``value``, however nested in dicts and lists."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
