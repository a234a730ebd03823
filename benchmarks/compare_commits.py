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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import ROOT, write_result  # noqa: E402

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


def _run(checkout: Path, benchmark: str) -> dict[str, tuple[float, str, float | None]]:
    """One ``--quick`` run of ``benchmark`` in ``checkout``: its numeric figures (value, unit,
    and the figure's ratio to its own baseline of that run) by name."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{benchmark}.py", "--quick"], cwd=checkout,
        env=os.environ | {"PYTHONPATH": str(checkout)}, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{benchmark} failed in {checkout}:\n{done.stderr[-3000:]}")
    payload = json.loads((checkout / "benchmarks" / "results" / f"{benchmark}.json").read_text())
    figures = payload["figures"]
    items = figures.items() if isinstance(figures, dict) else ((f["name"], f) for f in figures)
    return {name: (float(f["value"]), str(f.get("unit", "")), _number(f.get("ratio")))
            for name, f in items if _number(f.get("value")) is not None}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def compare(base: str, head: str, benchmarks: list[str], rounds: int) -> dict[str, dict]:
    """Run ``benchmarks`` at both commits, alternating; one figure per (benchmark, figure)."""
    measured: dict[str, dict[str, dict[str, list[float]]]] = {"base": {}, "head": {}}
    # Each run's own ratio to its in-run baseline (e.g. HF generate): it cancels the machine's
    # drift between runs that the raw values carry.
    own_ratios: dict[str, dict[str, list[float | None]]] = {"base": {}, "head": {}}
    units: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-compare-") as parent:
        checkouts = {"base": _worktree(base, Path(parent)), "head": _worktree(head, Path(parent))}
        try:
            for round_ in range(rounds):
                for benchmark in benchmarks:
                    order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                    for side in order:
                        print(f"round {round_ + 1}/{rounds}: {benchmark} at {side}", flush=True)
                        for name, (value, unit, ratio) in _run(checkouts[side], benchmark).items():
                            key = f"{benchmark}.{name}"
                            runs = measured[side].setdefault(benchmark, {})
                            runs.setdefault(name, []).append(value)
                            own_ratios[side].setdefault(key, []).append(ratio)
                            units[key] = unit
        finally:
            for folder in checkouts.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT,
                               check=False)  # fmt: skip
    figures: dict[str, dict] = {}
    for benchmark, runs in measured["head"].items():
        for name, values in runs.items():
            before = measured["base"].get(benchmark, {}).get(name)
            if not before:
                continue
            after, old = statistics.median(values), statistics.median(before)
            figures[f"{benchmark}.{name}"] = {
                "value": round(after, 4), "baseline": round(old, 4),
                "ratio": round(after / old, 3) if old else None,
                "unit": units[f"{benchmark}.{name}"],
                "baseline_name": f"the same figure at {base}, same sitting",
                "runs": values, "baseline_runs": before,
                "own_ratio_runs": own_ratios["head"][f"{benchmark}.{name}"],
                "baseline_own_ratio_runs": own_ratios["base"][f"{benchmark}.{name}"],
            }  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="+", help="names under benchmarks/ (no .py)")
    parser.add_argument("--base", required=True, help="the old commit")
    parser.add_argument("--head", default="HEAD", help="the new commit (default HEAD)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side per benchmark")
    args = parser.parse_args(argv)
    figures = compare(args.base, args.head, args.benchmarks, args.rounds)
    path = write_result(RESULT, figures, merge=True)  # each run's figures with its own command
    for name, figure in figures.items():
        print(f"{name}: {figure['baseline']} -> {figure['value']} (x{figure['ratio']})")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
