"""A resumed training run continues exactly: same next batch, same samples, same update."""

from __future__ import annotations

import pytest

from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.train import HERE, run

pytestmark = pytest.mark.slow


def _config(tmp_path, name: str, steps: int, resume: bool = False) -> TrainConfig:
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = steps
    config.data.batch_size = 4
    config.rollout.n = 4
    config.checkpoint.dir = str(tmp_path / name)
    config.checkpoint.every = 1
    config.checkpoint.resume = resume
    config.checkpoint.export_final = False
    config.tracking.enabled = False
    # The trainer in this process: exact resume is the pipeline's and the checkpoint's, wherever
    # the rank runs; each of the three runs then skips starting Ray and a trainer actor.
    config.trainer = config.trainer.model_copy(update={"placement": "in_process"})
    return config


def test_resumed_run_matches_the_uninterrupted_run(tmp_path):
    straight = run(_config(tmp_path, "straight", 3)).history

    run(_config(tmp_path, "interrupted", 2))
    resumed = run(_config(tmp_path, "interrupted", 3, resume=True))

    # Prefetched rollouts (on by default) still sample every step with that step's weights.
    for step, metrics in enumerate(straight):
        assert metrics["policy_version/sampled_min"] == step, step
        assert metrics["policy_version/sampled_max"] == step, step
        assert metrics["policy_version"] == step + 1, step
    assert resumed.steps == 3 and len(resumed.history) == 1  # only step 3 ran
    last, again = straight[-1], resumed.history[0]
    for key in ("reward/mean", "tokens/generated", "samples", "train/trained_tokens"):
        assert again[key] == last[key], key
    # Behaviour logprobs carry batch-shape float noise (~1e-7) from the engine.
    for key in ("train/loss", "train/grad_norm"):
        assert again[key] == pytest.approx(last[key], rel=1e-4, abs=1e-6), key
