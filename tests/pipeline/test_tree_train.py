"""Tree rollouts through a whole `sdk.train` run (the demo agent, in-process engine): each
group trains on its n leaves with Tree-GRPO advantages, the trunk counted once in the
generated tokens, every leaf's trace tagged with its path and the credit of its nodes, and a trace per tree."""

from __future__ import annotations

import pytest

from agentrl_sdk.tracing import search_rollout_traces
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow


def test_a_tree_run_trains_on_every_leaf_and_traces_the_tree(trained, tmp_path):
    config = demo_config(2, batch_size=2, n=4, in_process=True)
    config.rollout.tree.enabled = True  # 2 roots x 2 continuations after the tool node
    config.algorithm.advantage_estimator = "tree"
    config.tracking.enabled, config.tracking.traces = True, "all"
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train_demo(config, reward=lambda state, row, traj: float(traj.sample_index % 2))

    assert result.steps == 2
    for samples in trained.values():
        by_row: dict[str, set[int]] = {}
        for s in samples:
            by_row.setdefault(s.row_id, set()).add(s.sample_index)
        assert all(leaves == {0, 1, 2, 3} for leaves in by_row.values())
    for step, m in enumerate(result.history):  # a trunk's tokens generated once, trained twice
        in_leaves = sum(sum(s.response_mask) for s in trained[step])
        assert 0 < m["tokens/generated"] < in_leaves
    found = search_rollout_traces(config.tracking.uri, run_id=result.run_id, step=0, limit=100)
    leaves, trees = (search_rollout_traces(config.tracking.uri, run_id=result.run_id, step=0,
                                           kind=kind, limit=100) for kind in ("rollout", "tree"))
    assert len(found) == len(leaves) + len(trees)
    assert len(leaves) == 8 and any("." in t.tags["tree_path"] for t in leaves)
    # one trace per tree besides: 2 rows x 2 trees, each with its 2 leaves
    assert sorted((t.tags["row_id"], t.tags["tree_path"]) for t in trees) == sorted(
        (row, tree) for row in {t.tags["row_id"] for t in leaves} for tree in ("0", "1"))
    assert {t.tags["tree_leaves"] for t in trees} == {"2"}
