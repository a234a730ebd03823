"""Training loops: the synchronous pipeline and the fully asynchronous one, same job parts."""

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
from agentrl_sdk.pipeline.fully_async import run_fully_async
from agentrl_sdk.pipeline.job import JobSpec
from agentrl_sdk.pipeline.results import EvalResult, TrainResult
from agentrl_sdk.pipeline.sync import run_sync

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
    "run_sync",
]
