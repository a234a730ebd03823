"""PPO with a critic (``advantage_estimator: gae``) on the demo: the critic learns (value loss
falls, explained variance rises), warm-up holds the policy, and critic checkpoints resume."""

from __future__ import annotations

import json
import statistics

import pytest

from agentrl_sdk.pipeline import TrainConfig
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow

WARMUP = 2


def _ppo_config(steps: int) -> TrainConfig:
    config = demo_config(steps, batch_size=4, n=4)
    config.algorithm.advantage_estimator = "gae"
    # Discounted per sampled token: the returns vary along a rollout, which the critic can
    # learn in a few updates (the demo's reward alone is a coin flip it cannot yet predict).
    config.algorithm.gae.gamma = 0.8
    # The demo's lr 2e-3 on 16 rollouts a step can collapse the policy (GRPO too).
    config.trainer = config.trainer.model_copy(update={"lr": 2e-4})
    config.critic.lr = 3e-3
    config.critic.warmup_updates = WARMUP
    # The policy trains in this process (one trainer actor less to start per run); the critic,
    # which may not share the process, stays a Ray worker.
    config.trainer = config.trainer.model_copy(update={"placement": "in_process"})
    config.critic.trainer = {"ppo_epochs": 4, "num_mini_batches": 2, "placement": "ray"}
    return config


def test_the_critic_learns_and_the_policy_waits_for_its_warmup(tmp_path, trained):
    config = _ppo_config(6)
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 3
    config.checkpoint.export_final = False

    result = train_demo(config)

    history = result.history
    assert result.steps == 6
    # Warm-up: the critic trains alone, then both.
    assert [m["critic/warmup"] for m in history] == [1.0] * WARMUP + [0.0] * (6 - WARMUP)
    assert all("train/pg_loss" not in m for m in history[:WARMUP])
    assert all("train/pg_loss" in m for m in history[WARMUP:])
    # The zero-initialised head values every state 0: nothing explained, loss 0.5 E[R^2].
    assert history[0]["critic/values_mean"] == 0.0
    assert history[0]["critic/explained_variance"] == pytest.approx(0.0, abs=1e-9)
    curve = [(round(m["critic/value_loss"], 4), m.get("critic/explained_variance"))
             for m in history]
    first_loss = history[0]["critic/value_loss"]
    assert statistics.fmean(m["critic/value_loss"] for m in history[-3:]) < 0.7 * first_loss, curve
    later_ev = [m["critic/explained_variance"] for m in history[1:]
                if "critic/explained_variance" in m]
    assert max(later_ev) > 0.1 and statistics.fmean(later_ev) > 0.0, curve
    # The policy trained on per-token advantages: observation tokens carry none.
    samples = [s for step in range(WARMUP, 6) for s in trained[step]]
    assert samples and all(len(s.token_advantages) == len(s.response_ids) for s in samples)
    assert all(a == 0.0 for s in samples
               for a, m in zip(s.token_advantages, s.response_mask, strict=True) if m == 0)
    assert any(len(set(s.token_advantages)) > 2 for s in samples)  # they vary along a sequence
    # The critic's checkpoints sit beside the policy's, listed in the manifest.
    root = tmp_path / "ckpt"
    assert json.loads((root / "step_6" / "checkpoint.json").read_text())["critics"] == ["default"]
    assert (root / "critic" / "step_3" / "trainer_state.json").is_file()
    assert (root / "critic" / "step_6" / "trainer_state.json").is_file()


def test_fully_async_ppo_resumes_its_critic(tmp_path):
    config = _ppo_config(2)
    config.critic.warmup_updates = 0
    config.pipeline = "fully_async"
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.export_final = False

    first = train_demo(config)
    assert first.steps == 2 and all("critic/value_loss" in m for m in first.history)

    config.max_steps = 3
    config.checkpoint.resume = True
    resumed = train_demo(config)

    assert resumed.steps == 3 and len(resumed.history) == 1
    # A fresh critic would value every state exactly 0; the resumed one has learned.
    assert resumed.history[0]["critic/values_mean"] != 0.0
    state = json.loads((tmp_path / "ckpt" / "critic" / "step_3" / "trainer_state.json")
                       .read_text())
    assert state["updates"] == 3  # two before the resume, one after
