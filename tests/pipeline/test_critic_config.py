"""The `critic:` and `algorithm.gae` options, and a batch's advantages from a critic's values
(without Ray: a fake critic answers the values)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.batch import advantages
from agentrl_sdk.pipeline.update import critic_values
from agentrl_sdk.types import Sample


def test_critic_trainer_options_are_the_policys_with_its_own():
    config = TrainConfig.model_validate({
        "algorithm": {"advantage_estimator": "gae", "gae": {"gamma": 0.9, "lam": 0.95}},
        "trainer": {"lr": 1e-6, "world_size": 2, "lora": {"rank": 4}, "micro_batch_tokens": 64},
        "critic": {"lr": 1e-4, "cliprange_value": 0.2, "trainer": {"world_size": 1}},
    })  # fmt: skip
    trainer = config.critic.trainer_config(config.trainer)
    assert (trainer.lr, trainer.world_size, trainer.lora, trainer.micro_batch_tokens) == (
        1e-4, 1, None, 64)
    assert config.critic.loss.cliprange_value == 0.2 and config.critic.loss.agg == "token-mean"


@pytest.mark.parametrize(("options", "message"), [
    ({"critic": {"trainer": {"learning_rate": 1}}}, "unknown trainer options"),
    ({"critic": {"trainer": {"lora": {"rank": 4}}}}, "without LoRA"),
    ({"algorithm": {"advantage_estimator": "gae", "step_level": {"enabled": True}}},
     "step_level needs"),
    ({"algorithm": {"gae": {"lam": 1.5}}}, "lam"),
])  # fmt: skip
def test_bad_critic_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate(options)


class _FakeCritic:
    """Values each response token by its position: 0.1, 0.2, ... (0 at mask 0)."""

    def compute_values(self, batch):
        return [[0.1 * (t + 1) * m for t, m in enumerate(s.response_mask)]
                for s in batch.samples]


def _sample(policy: str, mask: list[int], reward: float) -> Sample:
    n = len(mask)
    return Sample(row_id="r", sample_index=0, policy=policy, prompt_ids=[1], response_ids=[5] * n,
                  response_mask=mask, old_logprobs=[0.0] * n, token_advantages=[0.0] * n,
                  reward=reward)


def test_a_critics_values_give_gae_token_advantages_per_policy():
    config = TrainConfig.model_validate({"algorithm": {
        "advantage_estimator": "gae", "gae": {"gamma": 1.0, "lam": 1.0, "whiten": False}}})
    critics = {"default": _FakeCritic()}
    samples = [_sample("default", [1, 0, 1], 1.0), _sample("other", [1, 1], 1.0),
               _sample("default", [1, 1], 0.0)]

    values = asyncio.run(critic_values(critics, samples))
    scored, metrics = advantages(samples, {}, config.algorithm.estimator, values)

    # gamma = lambda = 1: R_t = reward at every sampled token, A_t = R_t - V_t.
    assert scored[0].values == pytest.approx([0.1, 0.0, 0.3])
    assert scored[0].returns == pytest.approx([1.0, 0.0, 1.0])
    assert scored[0].token_advantages == pytest.approx([0.9, 0.0, 0.7])
    assert scored[0].advantage == pytest.approx(0.8)  # the mean over sampled tokens
    assert scored[2].token_advantages == pytest.approx([-0.1, -0.2])
    assert scored[1] is samples[1]  # a policy without a critic is left alone
    assert metrics["critic/values_mean"] == pytest.approx((0.1 + 0.3 + 0.1 + 0.2) / 4)
    assert metrics["critic/returns_mean"] == pytest.approx(0.5)
    assert "critic/explained_variance" in metrics


def test_gae_advantages_are_whitened_over_the_policys_sampled_tokens():
    config = TrainConfig.model_validate({"algorithm": {"advantage_estimator": "gae"}})
    samples = [_sample("default", [1, 0, 1], 1.0), _sample("default", [1, 1], 0.0)]
    values = asyncio.run(critic_values({"default": _FakeCritic()}, samples))
    scored, _ = advantages(samples, {}, config.algorithm.estimator, values)
    trained = [a for s in scored for a, m in zip(s.token_advantages, s.response_mask,
                                                 strict=True) if m]
    assert sum(trained) == pytest.approx(0.0, abs=1e-6)
    assert scored[0].token_advantages[1] == 0.0  # the observation token
