"""The redact hook runs on every record before rewards, rows and samples read it."""

from __future__ import annotations

import copy

import agentrl_sdk as sdk
from agentrl_sdk.production import drop_matching, redact_text
from examples.calculator.agent import make_rows
from tests.conftest import ScriptedEngine
from tests.production.conftest import serve

EMAIL = r"[\w.]+@[\w.]+\.\w+"


def _served_with_an_email(store, tokenizer):
    rows = make_rows(3, seed=4)
    rows[1] = copy.deepcopy(rows[1])
    rows[1]["messages"][-1]["content"] += " Mail the result to ana.lopez@example.com."
    return serve(ScriptedEngine, tokenizer, store, "served", rows)


def test_redacted_text_is_what_rewards_and_rows_see(store, qwen_tokenizer):
    served = _served_with_an_email(store, qwen_tokenizer)
    seen = []

    def reward(record):
        seen.append(record.inputs["messages"][-1]["content"])
        return 1.0

    selection = sdk.traces(store, experiment="served", reward=reward,
                           redact=redact_text([EMAIL]))
    assert len(selection) == 3
    assert not any("@example.com" in text for text in seen)
    assert sum("[redacted]" in text for text in seen) == 1
    rows = selection.rows()
    assert sum("Mail the result to [redacted]." in r["messages"][-1]["content"]
               for r in rows) == 1
    # the token ledger is what the model produced: text redaction leaves ids alone
    record = next(r for r in selection.records if r.trace_id == served.trace_ids[1])
    assert "@example.com" in qwen_tokenizer.decode(record.segments[0].prompt_ids)


def test_traces_whose_tokens_hold_a_pattern_are_dropped_and_counted(store, qwen_tokenizer):
    served = _served_with_an_email(store, qwen_tokenizer)
    selection = sdk.traces(store, experiment="served", reward=lambda r: 1.0,
                           redact=drop_matching([EMAIL], qwen_tokenizer))
    assert selection.left_out == {"redacted": [served.trace_ids[1]]}
    samples = selection.samples(qwen_tokenizer)
    assert len(samples) == 2
    assert not any("@example.com" in qwen_tokenizer.decode(s.prompt_ids + s.response_ids)
                   for s in samples)


def test_a_hook_that_drops_everything_is_counted(served):
    selection = sdk.traces(served.uri, experiment="served", redact=lambda record: None)
    assert selection.records == [] and selection.counts == {"found": 4, "kept": 0,
                                                            "redacted": 4}
