"""`checkpoint.keep_last`: only the newest checkpoints stay on disk."""

from __future__ import annotations

from agentrl_sdk.pipeline.checkpoints import prune_checkpoints


def test_keeps_the_newest_by_step_number_and_nothing_else_is_touched(tmp_path):
    for name in ("step_2", "step_10", "step_9", "step_1", "final_model", "step_x", "policies"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text(name)

    assert prune_checkpoints(tmp_path, None) == []
    deleted = prune_checkpoints(tmp_path, 2)

    assert [p.name for p in deleted] == ["step_1", "step_2"]  # by number: 10 is the newest
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "final_model", "policies", "step_10", "step_9", "step_x"]
    assert prune_checkpoints(tmp_path, 5) == []
