"""Exactly-once under crashes: a fully-async run with partial rollouts whose driver is SIGKILLed
mid-update, mid-push, mid-checkpoint and mid-rollout, resumed each time, ends with weights that
descend from every update exactly once, every drawn row trained once or still held, and one
MLflow run, FINISHED, with no step logged twice. (`benchmarks/crash_resume.py` does the same
through 100 random kills.)"""

from __future__ import annotations

import random

import pytest

from tests.faults._crash_runs import RayCluster, crash_run

pytestmark = pytest.mark.slow

STEPS = 3
PLANS = (
    {"kind": "update", "nth": 2, "delay_s": 0.3},  # step 2's update: step 1's checkpoint holds
    {"kind": "push", "nth": 2, "delay_s": 0.005},  # the push after the first update
    {"kind": "checkpoint", "nth": 1, "point": "manifest"},  # its parts written, not its manifest
    {"kind": "rollout", "nth": 4, "delay_s": 0.1},
)


@pytest.fixture
def ray_cluster(tmp_path):
    """A standing Ray cluster the drivers connect to: each life skips starting its own (~8 s);
    `test_driver_kill.py` kills a driver that started its own."""
    cluster = RayCluster(tmp_path)
    yield cluster.address
    cluster.stop()


def test_killed_at_every_kind_of_moment_the_run_trains_each_update_and_row_once(
    tmp_path, ray_cluster
):
    run = crash_run(tmp_path / "run", STEPS, kills=len(PLANS), rng=random.Random(0),
                    ray_address=ray_cluster, plans=PLANS)  # fmt: skip
    counts = run.counts
    assert run.kills == len(PLANS) and run.lives[-1]["end"] == "finished", run.lives
    kinds = counts["kills_by_kind"]  # a kill past a quick operation's end is KIND_end
    assert {k.removesuffix("_end") for k in kinds} == {
        "update", "push", "checkpoint:manifest", "rollout"}, kinds  # fmt: skip
    assert counts["problems"] == [] and counts["failed_lives"] == [], counts
    assert (counts["skipped"], counts["duplicated"], counts["lost"]) == (0, 0, 0), counts
    assert counts["trained_groups"] == STEPS * 3, counts  # batch_size 3, each on the chain
    assert counts["updates_redone"] >= 1, counts  # kills discarded updates, done again once
    assert counts["lives_in_lineage"] >= 2 and counts["resumes"] == len(PLANS), counts
    assert (counts["runs"], counts["status"]) == (1, "FINISHED"), counts
    assert (counts["steps_logged_twice"], counts["steps_not_logged"]) == (0, 0), counts
