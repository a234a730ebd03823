"""Traced token ids become training samples exactly, under the traced tokenizer only."""

from __future__ import annotations

import mlflow
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.algorithms import make_estimator
from agentrl_sdk.models.tokenizers import build_small_tokenizer
from agentrl_sdk.pipeline.batch import advantages
from agentrl_sdk.production import check_tokenizer
from tests.production.conftest import ensure_experiment


def test_samples_hold_the_ids_logprobs_and_versions_the_engine_saw_and_sampled(
        served, qwen_tokenizer):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    assert len(selection) == 4 and not selection.left_out
    by_row = {r.trace_id: r for r in selection.records}
    engine = served.engine
    for index, trace_id in enumerate(served.trace_ids):
        record = by_row[trace_id]
        [sample] = sdk.TraceSelection([record]).samples(qwen_tokenizer)
        first_prompt, second_prompt = engine.prompts[2 * index : 2 * index + 2]
        assert sample.prompt_ids == first_prompt
        # the second prompt is the first plus everything the segment holds before its reply
        generated = [t for t, m in zip(sample.response_ids, sample.response_mask) if m]
        replies = [c.response_ids for c in served.trajectories[index].calls]
        assert generated == replies[0] + replies[1]
        assert (sample.prompt_ids + sample.response_ids)[: len(second_prompt)] == second_prompt
        assert sample.prompt_ids + sample.response_ids == second_prompt + replies[1]
        logprobs = [lp for lp, m in zip(sample.old_logprobs, sample.response_mask) if m]
        assert logprobs == [-0.01 * (i + 1) for i in range(len(replies[0]))] + [
            -0.01 * (i + 1) for i in range(len(replies[1]))]
        assert {v for v, m in zip(sample.response_versions, sample.response_mask) if m} == {7}
        assert record.policy_versions == [7]
        assert [c.prompt_ids for c in record.calls] == [first_prompt, second_prompt]
        assert [c.response_logprobs for c in record.calls] == [
            c.response_logprobs for c in served.trajectories[index].calls]


def test_per_call_samples_are_the_engine_requests(served, qwen_tokenizer):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 0.5)
    samples = selection.samples(qwen_tokenizer, per_call=True)
    assert sorted(s.prompt_ids for s in samples) == sorted(served.engine.prompts)
    assert all(s.reward == 0.5 for s in samples)


def test_group_keys_set_row_ids(served, qwen_tokenizer):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    samples = selection.samples(qwen_tokenizer, group=lambda record: "calculator")
    assert {s.row_id for s in samples} == {"calculator"}
    assert sorted(s.sample_index for s in samples) == [0, 1, 2, 3]


def test_another_vocabulary_is_refused_naming_both_tokenizers(served):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    small = build_small_tokenizer()
    with pytest.raises(sdk.TraceMismatchError) as refused:
        selection.samples(small)
    message = str(refused.value)
    assert "4 trace(s) were made by tokenizer" in message
    assert "151669 ids" in message and f"{len(small.get_vocab())} ids" in message
    assert "never retokenized" in message and "TraceSelection.rows" in message


def test_the_same_vocabulary_under_another_chat_template_is_accepted(served, qwen3_tokenizer):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    assert len(selection.samples(qwen3_tokenizer)) == 4


def test_traces_without_a_ledger_or_identity_are_refused(served, qwen_tokenizer):
    mlflow.set_tracking_uri(served.uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(served.uri, "served"))
    with mlflow.start_span("agent") as span:  # another tool's trace: inputs, no token ids
        span.set_inputs({"messages": [{"role": "user", "content": "hi"}]})
        span.set_outputs({"messages": [{"role": "assistant", "content": "hello"}]})
    mlflow.flush_trace_async_logging()
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    assert len(selection) == 5
    with pytest.raises(sdk.TraceMismatchError, match=r"1 trace\(s\) hold no token ledger"):
        selection.samples(qwen_tokenizer)
    ours = [r for r in selection.records if r.has_ledger]
    unknown = ours[0].model_copy(update={"tokenizer": None})
    with pytest.raises(sdk.TraceMismatchError, match=r"1 trace\(s\) record no tokenizer identity"):
        check_tokenizer([*ours[1:], unknown], qwen_tokenizer)
    assert check_tokenizer(ours, qwen_tokenizer).vocab_size == 151669


def test_a_ledger_whose_calls_disagree_with_its_segments_is_refused(served, qwen_tokenizer):
    record = sdk.traces(served.uri, experiment="served", reward=lambda r: 1.0).records[0]
    calls = list(record.calls)
    calls[1] = calls[1].model_copy(update={"response_ids": calls[1].response_ids[:-1] + [0]})
    edited = record.model_copy(update={"calls": calls})
    with pytest.raises(sdk.TraceMismatchError, match="call 1's ids are not those of segment 0"):
        sdk.TraceSelection([edited]).samples(qwen_tokenizer)


def test_samples_need_a_reward(served, qwen_tokenizer):
    selection = sdk.traces(served.uri, experiment="served")
    with pytest.raises(ValueError, match="4 trace\\(s\\) have no reward"):
        selection.samples(qwen_tokenizer)


def test_the_trainers_estimators_take_traced_samples(served, qwen_tokenizer):
    mlflow.set_tracking_uri(served.uri)
    for trace_id, value in zip(served.trace_ids, [True, False, True, False], strict=True):
        mlflow.log_feedback(trace_id=trace_id, name="correct", value=value)
    selection = sdk.traces(served.uri, experiment="served", reward="correct")
    samples = selection.samples(qwen_tokenizer, group=lambda record: "calculator")
    scored, metrics = advantages(samples, {}, make_estimator("grpo"))
    assert metrics["samples"] == 4.0
    for before, after in zip(samples, scored, strict=True):
        assert after.prompt_ids == before.prompt_ids and after.response_ids == before.response_ids
        assert after.old_logprobs == before.old_logprobs
        expected = 0.866 if before.reward == 1.0 else -0.866  # (r - mean) / std, unbiased std
        assert after.advantage == pytest.approx(expected, abs=1e-3)


def test_exact_keeps_the_traces_of_one_vocabulary_and_counts_the_rest(served, qwen_tokenizer):
    mlflow.set_tracking_uri(served.uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(served.uri, "served"))
    with mlflow.start_span("agent") as span:
        span.set_inputs({"messages": [{"role": "user", "content": "hi"}]})
    mlflow.flush_trace_async_logging()
    selection = sdk.traces(served.uri, experiment="served", reward=lambda r: 1.0)
    exact = selection.exact(qwen_tokenizer)
    assert len(exact) == 4 and len(exact.left_out["not_exact"]) == 1
    assert len(exact.samples(qwen_tokenizer)) == 4
    assert exact.counts == {"found": 5, "kept": 4, "not_exact": 1}
    assert len(selection.exact(build_small_tokenizer())) == 0
