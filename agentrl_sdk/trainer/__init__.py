"""Distributed policy training: FSDP2 workers as Ray actors, checkpoints and weight sync."""

from agentrl_sdk.trainer.config import LoraConfig, TrainerConfig
from agentrl_sdk.trainer.group import TrainerError, TrainerGroup, init_ray
from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch, micro_batches, pack, shard_plan
from agentrl_sdk.trainer.weight_sync import (
    StateDictSource,
    SyncStats,
    WeightSource,
    WeightSync,
    WeightSyncError,
)
from agentrl_sdk.trainer.worker import PolicyWorker

__all__ = [
    "FlatSamples",
    "LoraConfig",
    "PackedBatch",
    "PolicyWorker",
    "StateDictSource",
    "SyncStats",
    "TrainerConfig",
    "TrainerError",
    "TrainerGroup",
    "WeightSource",
    "WeightSync",
    "WeightSyncError",
    "init_ray",
    "micro_batches",
    "pack",
    "shard_plan",
]
