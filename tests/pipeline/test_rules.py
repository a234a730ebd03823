"""The pipeline's rules, without Ray or engines: the schedule each pipeline runs, admission,
seeds, staleness and the dynamic-sampling budget; and the push's engine calls are bounded."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agentrl_sdk.errors import EngineError
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.loop import _Trainer
from agentrl_sdk.pipeline.rules import (
    Schedule,
    dynamic_sampling_metrics,
    rollout_config,
    rows_to_admit,
    sampled_steps,
    seed_step,
    staleness_metrics,
)
from agentrl_sdk.types import Segment, Trajectory


def _config(**fields) -> TrainConfig:
    return TrainConfig.model_validate({
        "data": {"batch_size": 4}, "rollout": {"n": 8, "concurrency": 16}, **fields})


def test_sync_is_the_on_policy_batched_schedule():
    sync = Schedule.of(_config())
    assert (sync.max_staleness, sync.sync_every, sync.batched, sync.prefetch) == (0, 1, True, True)
    assert sync.retry_stale and sync.queue_capacity() == 4
    assert not Schedule.of(_config(prefetch_rollouts=False)).prefetch
    overlapped = Schedule.of(_config(pipeline="fully_async",
                                     fully_async={"max_staleness": 2, "sync_every": 3}))
    assert (overlapped.max_staleness, overlapped.sync_every, overlapped.batched) == (2, 3, False)
    assert not overlapped.retry_stale and overlapped.queue_capacity() == 12
    # The pipeline argument overrides the config's choice (run_sync on any config).
    assert Schedule.of(_config(pipeline="fully_async"), "sync").max_staleness == 0


def test_batched_admission_starts_every_row_the_bound_allows_at_once():
    sync = Schedule.of(_config())
    assert rows_to_admit(sync, live_groups=0, in_flight=0, served_step=0) == 4
    assert rows_to_admit(sync, live_groups=4, in_flight=4, served_step=0) == 0
    assert rows_to_admit(sync, live_groups=3, in_flight=0, served_step=0) == 1  # a freed slot
    assert rows_to_admit(sync, live_groups=4, in_flight=0, served_step=1) == 4  # next weights


def test_row_by_row_admission_respects_staleness_and_concurrency():
    overlapped = Schedule.of(_config(pipeline="fully_async", fully_async={"max_staleness": 1}))
    # Bound: (served + staleness + 1) * batch = 8 live groups at step 0.
    assert rows_to_admit(overlapped, live_groups=7, in_flight=0, served_step=0) == 1
    assert rows_to_admit(overlapped, live_groups=8, in_flight=0, served_step=0) == 0
    # Concurrency 16 holds two groups of 8; a lone group always may start.
    assert rows_to_admit(overlapped, live_groups=1, in_flight=1, served_step=0) == 1
    assert rows_to_admit(overlapped, live_groups=2, in_flight=2, served_step=0) == 0
    big = Schedule(batch_size=1, n=32, concurrency=16, max_staleness=0, batched=False)
    assert rows_to_admit(big, live_groups=0, in_flight=0, served_step=0) == 1


def test_a_rows_seed_is_its_steps_and_survives_a_resume():
    assert [seed_step(i, 4) for i in (0, 3, 4, 9)] == [0, 0, 1, 2]
    config = _config(rollout={"sampling": {"seed": 10}})
    assert rollout_config(config, 3).sampling.seed == 13
    assert config.rollout.sampling.seed == 10  # not changed in place
    unseeded = _config()
    assert rollout_config(unseeded, 3) is unseeded.rollout


def test_staleness_and_the_flat_budget():
    overlapped = Schedule.of(_config(pipeline="fully_async", fully_async={"max_staleness": 1}))
    assert not overlapped.is_stale(1) and overlapped.is_stale(2)
    assert Schedule.of(_config()).flat_budget == 0
    sampling = _config(algorithm={"dynamic_sampling": {"enabled": True, "max_extra_rounds": 2}})
    schedule = Schedule.of(sampling)
    assert schedule.flat_budget == 8  # two batches' worth of rows without signal
    assert dynamic_sampling_metrics(schedule, with_signal=4, flat=5) == {
        "count/rows_sampled": 9.0, "dynamic_sampling/rows_with_signal": 4.0,
        "dynamic_sampling/extra_rounds": 2.0}
    assert dynamic_sampling_metrics(Schedule.of(_config()), 4, 0) == {}
    assert staleness_metrics([0, 1, 1]) == {
        "staleness/0": 1.0, "staleness/1": 2.0, "staleness/mean": pytest.approx(2 / 3),
        "staleness/max": 1.0}
    assert staleness_metrics([]) == {}


def test_pushes_every_sync_every_updates():
    schedule = Schedule(batch_size=1, n=1, concurrency=1, max_staleness=2, sync_every=3)
    assert [schedule.pushes_after(step) for step in range(6)] == [
        False, False, True, False, False, True]


def test_sampled_steps_are_the_versions_of_trained_tokens_only():
    segment = Segment(
        node="solver", policy="default", prompt_ids=[1], response_ids=[5, 6, 7],
        response_mask=[1, 0, 1], response_logprobs=[0.0, 0.0, 0.0], response_versions=[2, 9, 3],
    )  # fmt: skip
    traj = Trajectory(row_id="r", sample_index=0, segments=[segment])
    assert sampled_steps([traj], ["default"]) == [2, 3]  # the masked token's version is not
    assert sampled_steps([traj], ["other"]) == []


async def test_an_engine_that_never_pauses_fails_the_push_with_a_reason_not_a_hang():
    trainer = _Trainer.__new__(_Trainer)  # only its job's config is read here
    trainer.job = SimpleNamespace(config=_config(trainer={"weight_sync_timeout_s": 0.2}))
    with pytest.raises(EngineError, match="did not pause within trainer.weight_sync_timeout_s"):
        await trainer._each_engine("pause", [asyncio.sleep(3600)])
    await trainer._each_engine("resume", [asyncio.sleep(0)])  # an answering engine: no error


def test_engines_idle_until_the_push_only_on_policy_and_before_a_push():
    sync = Schedule.of(_config())
    assert all(sync.idle_until_push(step) for step in range(3))
    every_2nd = Schedule(batch_size=1, n=1, concurrency=1, sync_every=2)
    assert [every_2nd.idle_until_push(step) for step in range(4)] == [False, True, False, True]
    overlapped = Schedule.of(_config(pipeline="fully_async", fully_async={"max_staleness": 1}))
    assert not overlapped.idle_until_push(0)  # rollouts go on sampling on the served weights
