"""The demo's PPO config is the demo's job with GAE advantages and a critic (its run is in
benchmarks/algorithms.py)."""

from __future__ import annotations

from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.train import HERE


def test_config_ppo_is_the_demo_with_a_critic():
    grpo = TrainConfig.from_yaml(HERE / "config.yaml")
    ppo = TrainConfig.from_yaml(HERE / "config_ppo.yaml")

    assert (grpo.algorithm.advantage_estimator, ppo.algorithm.advantage_estimator) == (
        "grpo", "gae")
    assert ppo.critic.warmup_updates == 2 and ppo.critic.trainer == {"ppo_epochs": 2}
    critic_trainer = ppo.critic.trainer_config(ppo.trainer)
    assert (critic_trainer.lr, critic_trainer.ppo_epochs) == (ppo.critic.lr, 2)
    # Everything but the algorithm, the critic and where the runs write is the same job.
    same = {"algorithm", "critic", "checkpoint", "tracking"}
    assert ppo.model_dump(exclude=same) == grpo.model_dump(exclude=same)
    assert ppo.algorithm.model_dump(exclude={"advantage_estimator"}) == (
        grpo.algorithm.model_dump(exclude={"advantage_estimator"}))
    assert ppo.checkpoint.dir != grpo.checkpoint.dir
