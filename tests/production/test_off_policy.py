"""Off-policy RL on traced tokens: the real TorchEngine serves a graph, its traces are read back
from MLflow, and `sdk.train_on_traces` trains the model on exactly the ids and logprobs the
engine returned, weighted by importance weights that are 1 where the weights did not move."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from tests.engines._tiny import tiny_model_dir
from tests.production._torch_serving import serve_on_torch_engine


@pytest.fixture
def served_by_torch_engine(store):
    """Four sampled answers of the tiny model to one question, traced into ``store``, and the
    engine's own record of every request and answer."""
    path = str(tiny_model_dir(0))
    _, answers = serve_on_torch_engine(store, path, n=4, max_tokens=8, seed=11)
    return path, answers


def test_the_trained_batch_is_the_traced_tokens_and_the_model_moves(
    served_by_torch_engine, store, tmp_path
):
    path, answers = served_by_torch_engine
    # A rule over the traced answer (its ids' sum): the four rewards differ within the group.
    selection = sdk.traces(store, experiment="served",
                           reward=lambda record: float(sum(record.calls[0].response_ids)))
    config = sdk.TrainConfig.model_validate({
        "model": {"path": path},
        "trainer": {"placement": "in_process", "lr": 1e-3},
        "rollout": {"sampling": {"temperature": 1.0}},
    })
    result = sdk.train_on_traces(selection, config, per_call=True, output_dir=tmp_path)

    trained = sorted((s.prompt_ids, s.response_ids, s.old_logprobs, s.response_versions)
                     for s in result.samples)
    answered = sorted((prompt, r.token_ids, r.logprobs, r.versions) for prompt, r in answers)
    assert len(trained) == 8 and trained == answered  # id for id, logprob for logprob
    # One group (all traces): advantages are each reward against their mean, not all zero.
    by_trace = {s.row_id for s in result.samples}
    assert by_trace == {"all"}
    assert any(a != 0.0 for s in result.samples for a in s.token_advantages)
    (update,) = result.updates
    assert math.isfinite(update["loss"])
    # The trainer and the engine hold the same weights: the importance weights are ~1.
    assert update["is_weight_mean"] == pytest.approx(1.0, abs=0.02), update
    final = Path(result.final_model)
    assert (final / "config.json").is_file() and final.parent == tmp_path


def test_stale_traces_are_left_out_and_counted(served):
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    assert {v for r in selection.records for v in r.policy_versions} == {7}
    old = selection.records[0]
    selection.records[0] = old.model_copy(update={"calls": [
        c.model_copy(update={"policy_version": 4}) for c in old.calls]})
    newest_ms = max(r.timestamp_ms for r in selection.records)

    by_version = selection.recent(max_version_lag=2, now_ms=newest_ms)
    assert len(by_version) == 3 and by_version.left_out["stale"] == [old.trace_id]
    assert len(selection.recent(max_version_lag=3, now_ms=newest_ms)) == 4

    oldest = min(selection.records, key=lambda r: r.timestamp_ms)
    by_age = selection.recent(max_age_s=(newest_ms - oldest.timestamp_ms) / 1000 - 0.001,
                              now_ms=newest_ms)
    assert oldest.trace_id in by_age.left_out["stale"]
    assert by_age.counts["stale"] == len(by_age.left_out["stale"]) >= 1


def test_an_estimator_that_needs_a_critic_is_refused(served_by_torch_engine, store):
    path, _ = served_by_torch_engine
    selection = sdk.traces(store, experiment="served", reward=lambda record: 1.0)
    config = sdk.TrainConfig.model_validate({
        "model": {"path": path}, "algorithm": {"advantage_estimator": "gae"},
    })
    with pytest.raises(ValueError, match="needs a critic's values"):
        sdk.train_on_traces(selection, config)


def test_the_best_traces_are_learned_token_for_token(served_by_torch_engine, store, tmp_path):
    from agentrl_sdk.production.finetune import sft_examples

    path, _ = served_by_torch_engine
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    selection = sdk.traces(store, experiment="served",
                           reward=lambda record: float(sum(record.calls[0].response_ids)))
    best = max(selection.records, key=lambda r: r.reward)
    made = sft_examples([best], tokenizer)
    assert made.exact == [best.trace_id] and made.retokenized == []
    (segment,) = best.segments  # the node's two calls share one segment
    (example,) = made.examples
    assert example == (segment.prompt_ids + segment.response_ids,
                       [0] * len(segment.prompt_ids) + segment.response_mask)

    result = sdk.finetune_on_traces(selection, path, tmp_path, top_fraction=0.5, steps=4,
                                    lr=1e-2, batch_size=2)
    assert len(result.exact) == 2 and best.trace_id in result.exact and not result.retokenized
    assert result.losses[-1] < result.losses[0], result.losses
    assert (Path(result.final_model) / "config.json").is_file()


def test_another_models_traces_are_retokenized_from_their_conversation(served):
    from agentrl_sdk.production.finetune import sft_examples

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir(0)), local_files_only=True)
    selection = sdk.traces(served.uri, experiment="served", reward=lambda record: 1.0)
    made = sft_examples(selection.records, tokenizer)
    assert made.exact == [] and len(made.retokenized) == 4 and made.left_out == {}
    learned = [tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
               for ids, mask in made.examples]
    answers = {f"The answer is {row['answer']}." for row in served.rows}
    assert all(any(a in text for a in answers) for text in learned), learned

    refused = sft_examples(selection.records, tokenizer, retokenize="never")
    assert refused.examples == [] and len(refused.left_out["not_exact"]) == 4
