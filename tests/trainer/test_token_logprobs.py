"""`response_logprobs`: projecting only trained positions, in recomputed chunks, changes no
value and no gradient of the full-vocabulary computation."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentrl_sdk.algorithms import entropy_from_logits
from agentrl_sdk.trainer.packing import FlatSamples, pack
from agentrl_sdk.trainer.prefix_tree import pack_shared
from agentrl_sdk.trainer.token_logprobs import response_logprobs
from agentrl_sdk.types import Sample

TEMPERATURE = 0.7


def _model(cls=Qwen2ForCausalLM, config_cls=Qwen2Config, **extra):
    torch.manual_seed(0)
    config = config_cls(vocab_size=301, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        tie_word_embeddings=True, **extra)  # fmt: skip
    return cls(config).float()


def _flat(prefix: int = 0):
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(1, 300, (n,), generator=g).tolist()

    system = ids(prefix)  # a prompt prefix every sample shares

    def sample(p, mask):  # a tool output (mask 0) between two trained turns
        return Sample(row_id="r", sample_index=0, prompt_ids=system + ids(p),
                      response_ids=ids(len(mask)),
                      response_mask=mask, old_logprobs=[0.0] * len(mask),
                      token_advantages=[1.0] * len(mask))  # fmt: skip

    return FlatSamples.from_samples([
        sample(7, [1, 1, 0, 0, 0, 1, 1]), sample(3, [1, 1, 1]), sample(5, [0, 1, 0, 1]),
    ])  # fmt: skip


def _batch():
    return pack(_flat(), [0, 1, 2])


def _full_vocabulary(model, batch):
    """The computation it replaces: every kept position projected, one log_softmax."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   logits_to_keep=batch.num_logits, use_cache=False).logits
    rows = torch.arange(logits.shape[0])[:, None]
    scaled = logits[rows, batch.logit_index].float() / TEMPERATURE
    logp = scaled.log_softmax(-1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    return logp, entropy_from_logits(scaled)


@pytest.mark.parametrize("chunk", [2, 512])
def test_values_and_gradients_equal_the_full_vocabulary_computation(chunk):
    model, batch = _model(), _batch()
    mask = batch.response_mask

    def loss_and_grads(logp, entropy):
        loss = ((logp * 1.3 - entropy * 0.1) * mask).sum()
        model.zero_grad()
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    want_logp, want_entropy = _full_vocabulary(model, batch)
    want = loss_and_grads(want_logp, want_entropy)
    logp, entropy = response_logprobs(model, batch, TEMPERATURE, with_entropy=True, chunk=chunk)
    assert torch.equal(logp == 0, mask == 0)  # nothing at mask-0 positions
    torch.testing.assert_close(logp, want_logp * mask, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, want_entropy * mask, atol=1e-6, rtol=0)
    got = loss_and_grads(logp, entropy)
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with torch.no_grad():  # no autograd: the same values, no recomputation
        plain, none = response_logprobs(model, batch, TEMPERATURE, with_entropy=False,
                                        chunk=chunk)
    assert torch.equal(plain, logp.detach()) and none is None


def test_a_model_that_post_processes_its_logits_is_refused():
    model = _model(Gemma2ForCausalLM, Gemma2Config, head_dim=8, final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="post-processes its LM head"):
        response_logprobs(model, _batch(), TEMPERATURE, with_entropy=False)
    # The head is restored: the model computes plain logits again.
    assert model(input_ids=torch.tensor([[1, 2]])).logits.shape == (1, 2, 301)


def _loss_and_grads(model, batch):
    logp, entropy = response_logprobs(model, batch, TEMPERATURE, with_entropy=True)
    loss = ((logp * 1.3 - entropy * 0.1) * batch.response_mask).sum()
    model.zero_grad()
    loss.backward()
    return logp.detach(), entropy.detach(), loss.item(), [p.grad.clone() for p in model.parameters()]


def test_a_shared_prefix_packed_once_gives_the_padded_values_and_gradients():
    model, flat = _model(), _flat(prefix=9)
    shared = pack_shared(flat, [0, 1, 2])
    # The 9 shared tokens + each sample's own prompt and response, no padding.
    assert shared.input_ids.shape == (1, 9 + (7 + 7) + (3 + 3) + (5 + 4))
    assert shared.position_ids[0, 9:16].tolist() == list(range(9, 16))
    want, got = _loss_and_grads(model, pack(flat, [0, 1, 2])), _loss_and_grads(model, shared)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)  # logprobs
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)  # entropies
    assert got[2] == pytest.approx(want[2], abs=1e-5)  # the loss
    for a, b in zip(got[3], want[3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_leaves_sharing_trained_tokens_give_the_padded_values_and_gradients():
    """Leaves of a rollout tree share their trunk: the prompt, a trained reply and a tool's
    output. Packed once, each leaf's advantage still weighs the trunk's tokens for it (a
    clipped, non-linear loss per leaf), as when each leaf is laid out alone."""
    g = torch.Generator().manual_seed(2)

    def ids(n):
        return torch.randint(1, 300, (n,), generator=g).tolist()

    prompt, trunk = ids(6), ids(5)  # trunk: a reply of 3 trained tokens, then 2 of a tool's

    def leaf(own: int, adv: float, prompt=prompt, trunk=trunk) -> Sample:
        mask = [1, 1, 1, 0, 0] + [1] * own if trunk else [1] * own
        return Sample(row_id="r", sample_index=0, prompt_ids=prompt,
                      response_ids=trunk + ids(own), response_mask=mask,
                      old_logprobs=[-1.0] * len(mask), token_advantages=[adv] * len(mask))  # fmt: skip

    flat = FlatSamples.from_samples([
        leaf(2, 1.0), leaf(3, -1.0), leaf(1, 0.5), leaf(4, 2.0, prompt=prompt[:4] + ids(3), trunk=[]),
    ])  # fmt: skip
    shared = pack_shared(flat, [0, 1, 2, 3])
    assert shared.input_ids.shape == (1, (6 + 5 + 2) + 3 + 1 + (3 + 4))  # the trunk once

    model = _model()
    got, want = [], []
    for batch, out in ((shared, got), (pack(flat, [0, 1, 2, 3]), want)):
        logp, entropy = response_logprobs(model, batch, TEMPERATURE, with_entropy=True)
        ratio = (logp - batch.old_logprobs).exp()
        clipped = torch.minimum(ratio * batch.advantages,
                                ratio.clamp(0.8, 1.2) * batch.advantages)  # fmt: skip
        loss = ((clipped + 0.1 * entropy) * batch.response_mask).sum()
        model.zero_grad()
        loss.backward()
        out += [logp.detach(), loss.item(), [p.grad.clone() for p in model.parameters()]]
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    assert got[1] == pytest.approx(want[1], abs=1e-5)
    for a, b in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
