"""The value model of an architecture without a token-classification class: the backbone with
a ``Linear(hidden, 1)`` head computes what transformers' token-classification model does."""

from __future__ import annotations

import torch
from transformers import AutoModelForTokenClassification

from agentrl_sdk.trainer.critic import BackboneWithValueHead, _value_head


def test_backbone_with_value_head_matches_token_classification(model_path):
    ours = BackboneWithValueHead.from_pretrained(str(model_path)).eval()
    theirs = AutoModelForTokenClassification.from_pretrained(
        str(model_path), num_labels=1, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        ours.score.load_state_dict(theirs.score.state_dict())
    ids = torch.tensor([[5, 9, 23, 7, 0], [11, 4, 8, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = theirs(input_ids=ids, attention_mask=mask).logits
    assert got.shape == (2, 5, 1)
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-6)
    assert _value_head(ours) is ours.score
    assert set(ours._no_split_modules) == set(theirs._no_split_modules)  # FSDP2 finds layers


def test_a_value_worker_falls_back_to_the_backbone_and_learns(model_path, monkeypatch):
    """In this process (one rank, no Ray): the worker loads, shards and trains the fallback."""
    import transformers

    from agentrl_sdk.algorithms import ValueLossConfig
    from agentrl_sdk.trainer import FlatSamples, TrainerConfig
    from agentrl_sdk.trainer.critic import ValueWorker
    from agentrl_sdk.types import Sample

    def unsupported(*args, **kwargs):
        raise ValueError("Unrecognized configuration class for AutoModelForTokenClassification")

    monkeypatch.setattr(transformers.AutoModelForTokenClassification, "from_pretrained",
                        unsupported)
    worker = ValueWorker(0, 1, str(model_path), TrainerConfig(lr=1e-2), ValueLossConfig())
    # setup sets this process's torch threads as a rank's: later tests' in-process references
    # (exact to 1e-5) must compute with the threads they had.
    threads = torch.get_num_threads()
    try:
        worker.setup(*worker.rendezvous_address())
        assert isinstance(worker.sharded.model, BackboneWithValueHead)  # FSDP2-sharded all the same
        samples = [Sample(row_id="r", sample_index=i, prompt_ids=[3, 4 + i],
                          response_ids=[7, 8, 9], response_mask=[1, 0, 1],
                          old_logprobs=[0.0] * 3, token_advantages=[0.0] * 3, values=[0.0] * 3,
                          returns=[float(i), 0.0, float(i)]) for i in range(2)]
        flat = FlatSamples.from_samples(samples)
        assert worker.compute_values(flat).tolist() == [0.0] * 6  # the head starts at zero
        losses = [worker.update(flat)["value_loss"] for _ in range(4)]
        assert losses[0] == 0.25 and losses[-1] < losses[0]  # 0.5 * mean(R^2) = 0.5 * 2 / 4
    finally:
        worker.close()
        torch.set_num_threads(threads)
