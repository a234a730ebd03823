"""The critic group: a zero-initialised value head, the clipped value loss on FSDP2 ranks, and
checkpoints that restore the same values in a fresh group."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.algorithms import ValueLossConfig, compute_gae, explained_variance
from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Batch, Sample

pytestmark = pytest.mark.slow


def _samples() -> list[Sample]:
    """Four sequences, two with a tool response (mask 0) inside; rewards 1, 0, 1, 0."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, mask in enumerate([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1], [1, 0, 0, 1, 1], [1, 1, 1]]):
        prompt = torch.randint(3, 200, (4 + i,), generator=g).tolist()
        response = torch.randint(3, 200, (len(mask),), generator=g).tolist()
        out.append(Sample(row_id=f"r{i}", sample_index=0, prompt_ids=prompt, response_ids=response,
                          response_mask=mask, old_logprobs=[0.0] * len(mask),
                          token_advantages=[0.0] * len(mask), reward=float(i % 2 == 0)))
    return out


def _scored(samples: list[Sample], values: list[list[float]]) -> tuple[list[Sample], float]:
    """The samples with GAE (gamma = lambda = 1) values and returns, and the explained variance."""
    scored, ev_v, ev_r, ev_m = [], [], [], []
    for s, v in zip(samples, values, strict=True):
        v_t, m = torch.tensor([v]), torch.tensor([s.response_mask])
        adv, ret = compute_gae(torch.tensor([s.reward]), v_t, m)
        scored.append(s.model_copy(update={"values": v, "returns": ret[0].tolist(),
                                           "token_advantages": adv[0].tolist()}))
        ev_v += v
        ev_r += ret[0].tolist()
        ev_m += s.response_mask
    ev = explained_variance(torch.tensor([ev_v]), torch.tensor([ev_r]), torch.tensor([ev_m]))
    return scored, ev


def test_critic_learns_the_returns_and_resumes_exactly(ray_session, model_path, tmp_path):
    config = TrainerConfig(lr=1e-2, micro_batch_tokens=24, warmup_steps=0, max_grad_norm=None)
    samples = _samples()
    with CriticGroup(model_path, config, ValueLossConfig(cliprange_value=10.0)) as critic:
        values = critic.compute_values(Batch(samples=samples))
        assert all(v == [0.0] * len(s.response_ids) for v, s in zip(values, samples, strict=True))
        losses, evs = [], []
        for _ in range(8):
            scored, ev = _scored(samples, critic.compute_values(Batch(samples=samples)))
            evs.append(ev)
            losses.append(critic.update(Batch(samples=scored))["value_loss"])
        # Zero values: loss = 0.5 * mean(R^2) over the 14 trained tokens (7 of them reward 1).
        assert losses[0] == pytest.approx(0.5 * 7 / 14, rel=1e-5)
        assert losses[-1] < 0.5 * losses[0]
        assert evs[0] == pytest.approx(0.0)  # V = 0 explains nothing
        assert evs[-1] > 0.4 and evs[-1] > evs[1] > evs[0]
        critic.save_checkpoint(tmp_path / "critic")
        saved = critic.compute_values(Batch(samples=samples))
        # Mask-0 positions report 0; trained ones moved toward their sequence's reward.
        assert saved[0][2:4] == [0.0, 0.0] and saved[0][0] > saved[1][0]
    with CriticGroup(model_path, config, ValueLossConfig(cliprange_value=10.0)) as fresh:
        fresh.load_checkpoint(tmp_path / "critic")
        assert fresh.compute_values(Batch(samples=samples)) == saved
