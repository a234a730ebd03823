"""Write tests/file_seconds.json, each test file's wall time, from a pytest report.

    .venv/bin/python -m pytest -m "slow or not slow" -n 2 --dist loadfile --durations=0 | tee run.log
    python scripts/file_seconds.py run.log

The test run orders its files by these times, longest first (tests/conftest.py), so that two
workers end together. Each file's time is the sum of its tests' setup, call and teardown.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(?P<file>tests/[^:\s]+\.py)")


def file_seconds(report: str) -> dict[str, float]:
    """Seconds per test file in a ``--durations=0`` report, longest first."""
    totals: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        if match := LINE.match(line.strip()):
            totals[match["file"]] += float(match["seconds"])
    return {name: round(s, 1) for name, s in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the saved output of a --durations=0 run")
    args = parser.parse_args()
    times = file_seconds(args.report.read_text())
    target = ROOT / "tests" / "file_seconds.json"
    target.write_text(json.dumps(times, indent=1) + "\n")
    print(f"{len(times)} files, {sum(times.values()) / 60:.1f} worker-minutes -> {target}")


if __name__ == "__main__":
    main()
