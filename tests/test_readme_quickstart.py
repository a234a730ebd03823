"""README.md's Quickstart runs as written: its config, data row and graph train, and the
traces it points to are there."""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from readme_quickstart import quickstart_blocks, run_quickstart  # noqa: E402


def test_the_quickstart_is_short_and_complete() -> None:
    blocks = {b.title: b for b in quickstart_blocks() if b.title}
    assert set(blocks) == {"config.yaml", "rows.jsonl", "train.py"}
    assert len(blocks["train.py"].text.splitlines()) <= 25


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("AGENTRL_REQUIRE_WHEEL")),
                    reason="tests/test_wheel.py runs the same blocks from the installed wheel")
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    printed = run_quickstart(tmp_path, Path(sys.executable).parent)
    curve = re.search(r"^(\[[-0-9., ]+\]) (\S+)$", printed, re.M)
    assert curve, printed[-2000:]
    assert len(ast.literal_eval(curve.group(1))) == 5  # max_steps: 5 updates
    assert (tmp_path / curve.group(2) / "config.json").is_file()  # the final model folder
    assert re.search(r"\b40 rollout traces in sqlite:///runs/mlflow.db", printed), printed[-2000:]
