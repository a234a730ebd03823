"""Dynamic sampling on the demo agent: no group without signal is trained, and each batch is
filled with rows that have signal, in both pipelines (and with per-call samples)."""

from __future__ import annotations

from collections import defaultdict

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.train import HERE
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow

BATCH = 3


def _half_the_rows_agree(state, row, traj) -> float:
    """Rows with an even index: every rollout scores 0.5 (no signal); odd ones: 0 or 1."""
    if int(row["id"].rsplit("-", 1)[1]) % 2 == 0:
        return 0.5
    return float(traj.sample_index % 2)


@pytest.mark.parametrize(("pipeline", "step_level"), [
    ("sync", False), ("fully_async", False), ("sync", True)])
def test_dynamic_sampling_fills_the_batch_with_groups_that_have_signal(trained, pipeline,
                                                                       step_level):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 2
    config.pipeline = pipeline
    config.evaluation.every = 0
    config.data.batch_size = BATCH
    config.rollout.n = 4
    config.checkpoint.dir = None
    config.tracking.enabled = False
    trainer_in_process(config)
    config.algorithm.dynamic_sampling.enabled = True
    config.algorithm.step_level.enabled = step_level  # each LLM call its own sample
    config.algorithm.step_level.anchor_weight = 1.0  # GiGPO anchor groups, when step_level
    job = resolve_entrypoints(config)

    result = sdk.train(job.graph, job.dataset, reward=_half_the_rows_agree, config=config,
                       input_fn=job.input_fn)

    assert result.steps == 2 and set(trained) == {0, 1}
    for samples in trained.values():
        rewards: dict[str, set[float]] = defaultdict(set)
        for s in samples:
            rewards[s.row_id].add(s.reward)
        assert len(rewards) == BATCH  # the batch was filled ...
        assert all(values == {0.0, 1.0} for values in rewards.values())  # ... with signal only
        if step_level:  # a call's tokens are all sampled ones
            assert all(s.response_mask == [1] * len(s.response_ids) for s in samples)
    dropped = sum(m["groups_dropped_no_signal"] for m in result.history)
    assert dropped > 0  # some rows agreed and were left out
    if pipeline == "sync":
        assert sum(m["dynamic_sampling/extra_rounds"] for m in result.history) > 0
    else:
        assert result.history[-1]["async/dropped_no_signal"] == dropped
