"""Benchmarks of two commits in one sitting: does a change that should not move a figure move it?

Each commit is checked out into a temporary git worktree; the benchmarks named run there in
alternating order (``--rounds`` times each), with this interpreter, and each figure of a
commit is its median over the rounds. The figures go to
``benchmarks/results/commit_comparison.json``: the value is the new commit's, the baseline the
old one's, measured in the same sitting (their result files in the worktrees are discarded).
Runs of other benchmarks are merged into the file, each figure with its own date and command.

    python benchmarks/compare_commits.py --base de23a43 weight_sync engine overhead async_vs_sync

Every benchmark runs with ``--quick``. A figure is compared only where both commits report it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import ROOT, _is_number, normalise, write_result  # noqa: E402

RESULT = "commit_comparison"
RUN_TIMEOUT_S = 1800.0


def _worktree(rev: str, parent: Path) -> Path:
    """A detached checkout of ``rev`` under ``parent``."""
    commit = f"{rev}^{{commit}}"  # a tag names its commit
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    folder = parent / sha
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(folder), sha], cwd=ROOT,
                   check=True)  # fmt: skip
    return folder


def _run(checkout: Path, benchmark: str) -> list[dict]:
    """One ``--quick`` run of ``benchmark`` in ``checkout``: its figures with numeric values."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{benchmark}.py", "--quick"], cwd=checkout,
        env=os.environ | {"PYTHONPATH": str(checkout)}, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{benchmark} failed in {checkout}:\n{done.stderr[-3000:]}")
    payload = json.loads((checkout / "benchmarks" / "results" / f"{benchmark}.json").read_text())
    return [f for f in normalise(payload, benchmark)["figures"] if _is_number(f["value"])]


def compare(base: str, head: str, benchmarks: list[str], rounds: int) -> dict[str, dict]:
    """Run ``benchmarks`` at both commits, alternating; one figure per (benchmark, figure)."""
    # By "benchmark.figure": each side's values, and each run's ratio to its own in-run baseline
    # (e.g. HF generate), which cancels the machine's drift between runs that values carry.
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-compare-") as parent:
        checkouts = {"base": _worktree(base, Path(parent)), "head": _worktree(head, Path(parent))}
        try:
            for round_ in range(rounds):
                for benchmark in benchmarks:
                    order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                    for side in order:
                        print(f"round {round_ + 1}/{rounds}: {benchmark} at {side}", flush=True)
                        for figure in _run(checkouts[side], benchmark):
                            entry = runs.setdefault(f"{benchmark}.{figure['name']}", {
                                "unit": figure.get("unit", ""), "base": ([], []),
                                "head": ([], [])})  # fmt: skip
                            entry[side][0].append(figure["value"])
                            entry[side][1].append(figure.get("ratio"))
        finally:
            for folder in checkouts.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT,
                               check=False)  # fmt: skip
    figures: dict[str, dict] = {}
    for name, entry in runs.items():
        (after_runs, after_ratios), (before_runs, before_ratios) = entry["head"], entry["base"]
        if not after_runs or not before_runs:
            continue  # reported by one commit only
        after, before = statistics.median(after_runs), statistics.median(before_runs)
        figures[name] = {
            "value": round(after, 4), "baseline": round(before, 4),
            "ratio": round(after / before, 3) if before else None, "unit": entry["unit"],
            "baseline_name": f"the same figure at {base}, same sitting",
            "runs": after_runs, "baseline_runs": before_runs,
            "own_ratio_runs": after_ratios, "baseline_own_ratio_runs": before_ratios,
        }  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="+", help="names under benchmarks/ (no .py)")
    parser.add_argument("--base", required=True, help="the old commit")
    parser.add_argument("--head", default="HEAD", help="the new commit (default HEAD)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side per benchmark")
    parser.add_argument("--name", default=RESULT,
                        help=f"the result file's name (default {RESULT}): a comparison of "
                        "its own, beside the others")  # fmt: skip
    args = parser.parse_args(argv)
    figures = compare(args.base, args.head, args.benchmarks, args.rounds)
    path = write_result(args.name, figures, merge=True)  # each run's figures with its own command
    for name, figure in figures.items():
        print(f"{name}: {figure['baseline']} -> {figure['value']} (x{figure['ratio']})")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
