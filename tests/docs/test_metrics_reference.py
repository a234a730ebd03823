"""docs/reference/metrics.md: every metric a real training job and its evaluations log has an
entry in the registry (`agentrl_sdk.pipeline.metric_names`) the page is generated from."""

from __future__ import annotations

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.pipeline.metric_names import METRICS, describe_metric
from tests.docs._helpers import assert_fresh
from tests.pipeline._demo import demo_config


def test_page_is_current(gen):
    assert_fresh(gen, "metrics.md")


def test_patterns_match_their_families_and_nothing_else():
    assert describe_metric("reward/mean").name == "reward/mean"  # exact before the family
    assert describe_metric("reward/tool/calculator").name == "reward/<component>"
    assert describe_metric("status/timeout").name == "status/<status>"
    assert describe_metric("staleness/3").name == "staleness/<k>"
    assert describe_metric("staleness/x") is None  # <k> is a number
    assert describe_metric("pass_at_16").name == "pass_at_<k>"
    assert describe_metric("train/researcher/loss").name == "train/loss"  # another policy's
    assert describe_metric("policy_version/researcher").name == "policy_version"
    assert describe_metric("rollout/segments_started.history_edited") is not None
    assert describe_metric("train/no_such_metric") is None
    assert describe_metric("adv_mean/extra") is None  # per-policy prefixes only where logged


def test_entries_are_unique_and_described():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(m.description.strip() and m.unit.strip() for m in METRICS)


@pytest.mark.slow
def test_every_metric_a_short_job_logs_is_in_the_registry(tmp_path):
    """Two updates of the tool-selection demo (in-process trainer, tracking on, dynamic
    sampling and the over-long penalty on, evaluated before and after each update)."""
    config = demo_config(2, batch_size=2, n=2)
    config.tracking.enabled = True
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.evaluation.every = 1
    config.evaluation.max_rows = 2
    config.trainer = config.trainer.model_copy(update={"placement": "in_process"})
    config.algorithm.dynamic_sampling.enabled = True
    config.algorithm.dynamic_sampling.max_extra_rounds = 1
    config.algorithm.overlong.buffer = 4
    job = resolve_entrypoints(config)
    result = sdk.train(job.graph, job.dataset, reward=job.reward, config=config,
                       input_fn=job.input_fn, eval_dataset=job.eval_dataset)  # fmt: skip
    logged = {name for step in result.history for name in step}
    evaluated = {name for e in result.evaluations for name in e.metrics}
    assert len(result.history) == 2 and len(result.evaluations) == 3
    assert {"reward/mean", "train/loss", "tracking/failed_writes", "traces/logged",
            "dynamic_sampling/rows_with_signal"} <= logged
    assert {"pass_at_1", "rows"} <= evaluated
    unknown = sorted(n for n in logged | evaluated if describe_metric(n) is None)
    assert not unknown, (
        f"metrics logged but missing from agentrl_sdk/pipeline/metric_names.py: {unknown}"
    )
