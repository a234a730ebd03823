"""A training driver for the fault tests: ``python -m tests.faults._driver CONFIG TRAINED
[KILL_STEP]``.

It trains the job in CONFIG (a `TrainConfig` as JSON) and appends the rows of every update to
TRAINED (one JSON line per step, written before the update). With KILL_STEP, it SIGKILLs itself
like a killed driver once that step's trainer state is on disk but its pipeline state is not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import agentrl_sdk.pipeline.checkpoints as checkpoints
import agentrl_sdk.pipeline.update as update_module
from agentrl_sdk.pipeline import TrainConfig
from tests.pipeline._demo import train_demo


def main(config_path: str, trained_path: str, kill_step: int | None = None) -> None:
    config = TrainConfig.model_validate_json(Path(config_path).read_text())
    update, write = update_module.update_policy, checkpoints._write_atomic

    async def record_rows(policy, step, samples):
        with open(trained_path, "a") as out:
            out.write(json.dumps({"step": step, "rows": sorted({s.row_id for s in samples})}))
            out.write("\n")
        return await update(policy, step, samples)

    def write_or_die(path: Path, data: bytes) -> None:
        if path.name == checkpoints.PIPELINE_STATE and path.parent.name == f"step_{kill_step}":
            os.kill(os.getpid(), signal.SIGKILL)
        write(path, data)

    update_module.update_policy = record_rows
    checkpoints._write_atomic = write_or_die
    train_demo(config)


def start(folder: Path, config: TrainConfig, kill_step: int | None = None) -> subprocess.Popen:
    """Start this driver on ``config`` in a session of its own (`stop` kills what it started);
    its trained rows go to ``folder / "trained.jsonl"``, its output to ``folder / "driver.log"``."""
    (folder / "config.json").write_text(config.model_dump_json())
    args = [str(folder / "config.json"), str(folder / "trained.jsonl")]
    args += [str(kill_step)] if kill_step is not None else []
    with open(folder / "driver.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "tests.faults._driver", *args],
                                cwd=Path(__file__).parents[2], start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)


def stop(driver: subprocess.Popen) -> None:
    """Kill the driver's whole session (the Ray processes it started go with it)."""
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait()


def leftovers(driver: subprocess.Popen) -> list[str]:
    """The names of the processes still running in the driver's session."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.getsid(int(pid)) == driver.pid:
                found.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return found


def trained_rows(folder: Path) -> dict[int, list[str]]:
    """The rows the driver updated on, by step (a step redone after a resume: the last time)."""
    lines = (folder / "trained.jsonl").read_text().splitlines()
    return {line["step"]: line["rows"] for line in map(json.loads, lines)}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
