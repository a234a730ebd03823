"""The tool-selection demo cut to a short job, for tests that need a real `sdk.train` run."""

from __future__ import annotations

import agentrl_sdk as sdk
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.pipeline import TrainConfig, TrainResult
from examples.tool_selection.agent import right_tool_reward
from examples.tool_selection.train import HERE


def trainer_in_process(config: TrainConfig) -> TrainConfig:
    """``config`` with its trainer in the job's own process, for tests whose subject is not
    where the trainer runs: no Ray and no trainer actor to start (~30 s of CPU a run under the
    test suite's load, ~4 s in process)."""
    config.trainer = config.trainer.model_copy(update={"placement": "in_process"})
    return config


def demo_config(
    steps: int, *, batch_size: int = 2, n: int = 4, in_process: bool = False
) -> TrainConfig:
    """The demo's config for ``steps`` updates of ``batch_size`` rows x ``n`` samples, with
    no evaluation, checkpoints or tracking (a test turns on what it checks); its trainer on
    Ray as the demo's, or ``in_process``."""
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    if in_process:
        trainer_in_process(config)
    config.max_steps = steps
    config.evaluation.every = 0  # no held-out rows here
    config.data.batch_size = batch_size
    config.rollout.n = n
    config.checkpoint.dir = None
    config.tracking.enabled = False
    return config


def train_demo(config: TrainConfig, reward=right_tool_reward) -> TrainResult:
    """``sdk.train`` on the demo's graph and rows under ``config``."""
    job = resolve_entrypoints(config)
    return sdk.train(job.graph, job.dataset, reward=reward, config=config, input_fn=job.input_fn)
