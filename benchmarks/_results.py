"""Writes a benchmark's figures to ``benchmarks/results/NAME.json`` with machine info."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def write_result(name: str, figures: dict[str, dict], *, merge: bool = False) -> Path:
    """Write one benchmark's figures in the shared result format and return the file's path.

    Args:
        name: Benchmark name; the file is ``results/{name}.json``.
        figures: ``{FIGURE: {"value", "baseline", "ratio", "goal", "unit"}}``, one per ratio.
        merge: Keep the file's other figures (a benchmark whose variants run separately);
            the machine and time are this run's.

    Returns:
        The path written.
    """
    path = RESULTS_DIR / f"{name}.json"
    if merge and path.exists():
        figures = json.loads(path.read_text())["figures"] | figures
    payload = {
        "benchmark": name,
        "figures": figures,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
