"""Training loops: the synchronous pipeline (the fully asynchronous one comes next)."""

from agentrl_sdk.pipeline.config import (
    CheckpointConfig,
    DataConfig,
    EngineConfig,
    EntrypointConfig,
    ModelConfig,
    RewardConfig,
    TrackingConfig,
    TrainConfig,
)
from agentrl_sdk.pipeline.sync import TrainResult, run_sync

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "EngineConfig",
    "EntrypointConfig",
    "ModelConfig",
    "RewardConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainResult",
    "run_sync",
]
