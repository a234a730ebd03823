"""The real TorchEngine serves a graph whose node calls the model twice; the traced rollouts,
selected back from MLflow, train on exactly the ids and logprobs the engine returned, under
the tokenizer loaded from the model folder, and are refused under another."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from tests.engines._tiny import tiny_model_dir
from tests.production._torch_serving import QUESTION, serve_on_torch_engine


def test_torch_engine_ids_and_logprobs_come_back_exactly(store, qwen_tokenizer):
    path = str(tiny_model_dir(0))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    trajectories, answers = serve_on_torch_engine(store, path, n=2, max_tokens=12, seed=5)
    assert [t.status for t in trajectories] == ["ok", "ok"]

    selection = sdk.traces(store, experiment="served", reward=lambda record: 1.0)
    assert len(selection) == 2 and selection.records[0].tokenizer.name == path
    samples = selection.samples(tokenizer, per_call=True)
    answered = sorted((prompt, r.token_ids, r.logprobs, r.versions) for prompt, r in answers)
    traced = sorted((s.prompt_ids, s.response_ids, s.old_logprobs, s.response_versions)
                    for s in samples)
    assert len(traced) == 4 and traced == answered  # every request, id for id, logprob for logprob
    rows_again = selection.rows()
    assert [r["messages"] for r in rows_again] == [QUESTION["messages"]] * 2

    with pytest.raises(sdk.TraceMismatchError, match="2 trace\\(s\\) were made by tokenizer"):
        selection.samples(qwen_tokenizer)
