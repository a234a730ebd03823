"""Tools stuck forever, sync and async, with and without a ToolNode timeout: the run
finishes every step, the timeouts are counted, and the process exits on its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_stuck_tools_neither_stall_training_nor_the_exit(tmp_path):
    out = tmp_path / "history.json"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tests.faults._stuck_tools_job", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads(out.read_text())
    assert [m["policy_version"] for m in history] == [1.0, 2.0, 3.0]
    total = {k: sum(m.get(k, 0.0) for m in history)
             for k in ("rollout/tool_timeouts", "status/timeout", "status/ok")}
    assert total["rollout/tool_timeouts"] >= 1  # the ToolNode gave up on stuck calls
    assert total["status/timeout"] >= 1  # rollout.timeout_s ended the untimed ones
    assert total["status/ok"] >= 1
    print(f"stuck-tools job: {time.monotonic() - start:.0f} s, {total}")
