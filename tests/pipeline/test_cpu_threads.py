"""Engines beside CPU trainers in fully_async get the cores the trainers do not reserve."""

from __future__ import annotations

import os

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.policies import engine_kwargs


def config(**fields) -> TrainConfig:
    base = {"model": {"path": "unused"}, "engine": {"backend": "torch"}}
    return TrainConfig.model_validate(base | fields)


def test_fully_async_engine_takes_the_cores_the_trainer_leaves() -> None:
    cores = len(os.sched_getaffinity(0))
    assert "cpu_threads" not in engine_kwargs(config())  # sync: phases take turns, all cores
    assert engine_kwargs(config(pipeline="fully_async"))["cpu_threads"] == max(1, cores - 1)
    wide = config(pipeline="fully_async", trainer={"world_size": 2, "num_cpus_per_worker": 0.5})
    assert engine_kwargs(wide)["cpu_threads"] == max(1, cores - 1)
    crowded = config(pipeline="fully_async", trainer={"num_cpus_per_worker": 64})
    assert engine_kwargs(crowded)["cpu_threads"] == 1


def test_set_threads_gpu_trainers_and_remote_clusters_are_left_alone() -> None:
    engine = {"backend": "torch", "options": {"cpu_threads": 3}}
    chosen = config(pipeline="fully_async", engine=engine)
    assert engine_kwargs(chosen)["cpu_threads"] == 3
    gpu = config(pipeline="fully_async", trainer={"num_gpus_per_worker": 1})
    assert "cpu_threads" not in engine_kwargs(gpu)
    remote = config(pipeline="fully_async", trainer={"ray_address": "10.0.0.1:6379"})
    assert "cpu_threads" not in engine_kwargs(remote)
