"""The training loop (sync = its on-policy schedule, fully_async = overlapped), its config and
evaluation."""

from agentrl_sdk.pipeline.config import (
    AsyncConfig,
    CheckpointConfig,
    DataConfig,
    EngineConfig,
    EntrypointConfig,
    EvalConfig,
    ModelConfig,
    RewardConfig,
    TrackingConfig,
    TrainConfig,
)
from agentrl_sdk.pipeline.evaluate import run_evaluation
from agentrl_sdk.pipeline.job import JobSpec
from agentrl_sdk.pipeline.loop import run_fully_async, run_pipeline, run_sync
from agentrl_sdk.pipeline.results import EvalResult, TrainResult

__all__ = [
    "AsyncConfig",
    "CheckpointConfig",
    "DataConfig",
    "EngineConfig",
    "EntrypointConfig",
    "EvalConfig",
    "EvalResult",
    "JobSpec",
    "ModelConfig",
    "RewardConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainResult",
    "run_evaluation",
    "run_fully_async",
    "run_pipeline",
    "run_sync",
]
