"""CPU threads: engines beside CPU trainers in fully_async get the cores the trainers do not
reserve; sync CPU trainers get every core while the engine idles."""

from __future__ import annotations

import os

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.policies import engine_kwargs, trainer_options


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


def test_sync_cpu_trainers_train_on_every_core_split_between_workers() -> None:
    cores = len(os.sched_getaffinity(0))
    assert trainer_options(config()).cpu_threads == cores  # the engine idles while it trains
    pair = config(trainer={"world_size": 2, "num_cpus_per_worker": 0.5})
    assert trainer_options(pair).cpu_threads == max(1, cores // 2)
    two_policies = config(policies={"judge": {"path": "unused"}})
    assert trainer_options(two_policies).cpu_threads == max(1, cores // 2)  # they train at once
    reserved = config(trainer={"num_cpus_per_worker": 64})
    assert trainer_options(reserved).cpu_threads == 64


def test_trainer_threads_as_set_or_async_gpu_remote_are_left_alone() -> None:
    assert trainer_options(config(trainer={"cpu_threads": 1})).cpu_threads == 1
    for other in (config(pipeline="fully_async"), config(trainer={"num_gpus_per_worker": 1}),
                  config(trainer={"ray_address": "10.0.0.1:6379"})):  # fmt: skip
        assert trainer_options(other).cpu_threads is None
