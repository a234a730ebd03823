"""What a killed driver leaves running: the processes it started (its private Ray cluster's
agents survive a SIGKILLed driver) are noted in the checkpoint folder, and the next start of the
job there stops those still running.

Only processes this job's driver started are touched: each is named by pid and start time, so a
pid the system has since given to another process is left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["LEFTOVERS", "forget_processes", "note_processes", "stop_leftovers"]

LEFTOVERS = "driver_processes.json"
"""The file in the checkpoint folder naming the running driver's child processes."""


def note_processes(directory: Path) -> None:
    """Write down this process's descendants (Ray's processes, once it started them)."""
    try:
        import psutil  # comes with ray[default]
    except ImportError:
        return

    driver = psutil.Process()
    noted = []
    for child in driver.children(recursive=True):
        try:
            noted.append({"pid": child.pid, "started": child.create_time(), "name": child.name()})
        except psutil.NoSuchProcess:
            continue
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LEFTOVERS).write_text(json.dumps(
        {"driver": {"pid": driver.pid, "started": driver.create_time()}, "processes": noted}))


def forget_processes(directory: Path) -> None:
    """The driver stopped what it started: nothing to clean up next time."""
    (directory / LEFTOVERS).unlink(missing_ok=True)


def stop_leftovers(directory: Path, timeout_s: float = 5.0) -> int:
    """Stop the processes a previous driver of this job noted and left running (it was
    killed); returns how many. Nothing when that driver is still alive (another job runs here)."""
    try:
        import psutil
    except ImportError:
        return 0

    path = directory / LEFTOVERS
    if not path.is_file():
        return 0
    noted = json.loads(path.read_text())
    if _running(psutil, noted["driver"]):
        return 0
    alive = [p for entry in noted["processes"] if (p := _running(psutil, entry)) is not None]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, still = psutil.wait_procs(alive, timeout=timeout_s)
    for process in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    if alive:
        names = sorted(e["name"] for e in noted["processes"] if e["pid"] in {p.pid for p in alive})
        logger.warning("stopped %d processes left running by a killed driver (pid %d) of this "
                       "job: %s", len(alive), noted["driver"]["pid"], ", ".join(names))
    path.unlink(missing_ok=True)
    return len(alive)


def _running(psutil, entry: dict):  # noqa: ANN001 - psutil is imported lazily
    """The noted process if it still runs (same pid and start time), else None."""
    try:
        process = psutil.Process(entry["pid"])
        return process if abs(process.create_time() - entry["started"]) < 1e-3 else None
    except psutil.NoSuchProcess:
        return None
