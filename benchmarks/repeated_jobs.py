"""Is the second ``sdk.train`` in one process as fast as the first? (notebooks, sweeps, and
the benchmarks that run several arms in one process.)

    python benchmarks/repeated_jobs.py [--jobs 3] [--steps 6]

Runs the real-model demo's recipe (``examples/word_problems``, evaluation off, its
end-of-job checkpoint on, each job in a folder of its own) ``--jobs`` times in this process.

Figures (``benchmarks/results/repeated_jobs.json``):

- ``rollout_s``: the later jobs' median rollout seconds per update over the first job's
  (goal <= 1.1: nothing a job leaves behind slows the next);
- ``rss_mb``: this process's resident memory after the last job over after the first (a
  finished job's engine and model are freed; goal <= 1.1);
- with each job's figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

import psutil  # noqa: E402
from _results import write_result  # noqa: E402
from real_model import CONFIG  # noqa: E402
from rich.console import Console  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="updates per job")
    args = parser.parse_args()
    from agentrl_sdk.pipeline import TrainConfig
    from examples._train import run

    Path("runs").mkdir(exist_ok=True)
    console, jobs = Console(), []
    for index in range(args.jobs):
        config = TrainConfig.from_yaml(CONFIG)
        config.max_steps, config.evaluation.every = args.steps, 0
        config.checkpoint.export_final = False
        with tempfile.TemporaryDirectory(prefix="repeated-jobs-") as folder:
            config.checkpoint.dir = folder
            start = time.monotonic()
            history = run(config).history
        jobs.append({
            "job": index,
            "wall_s": round(time.monotonic() - start, 1),
            "rollout_s": statistics.median(m["time/rollout_s"] for m in history),
            "tokens_per_s": statistics.median(m["tokens/generated_per_s"] for m in history),
            "rss_mb": psutil.Process().memory_info().rss >> 20,
            "threads": psutil.Process().num_threads(),
        })  # fmt: skip
        console.print(f"job {index}: {jobs[-1]}")
    first, later = jobs[0], jobs[1:]
    rollout = statistics.median(j["rollout_s"] for j in later)
    figures = {
        "rollout_s": {"value": round(rollout / first["rollout_s"], 3),
                      "baseline": first["rollout_s"], "after": rollout, "goal": 1.1,
                      "unit": "median rollout seconds per update, later jobs / the first"},
        "rss_mb": {"value": round(jobs[-1]["rss_mb"] / first["rss_mb"], 3),
                   "baseline": first["rss_mb"], "after": jobs[-1]["rss_mb"], "goal": 1.1,
                   "unit": "resident MB of this process after the last job / after the first"},
        "jobs": {"value": None, "baseline": None, "ratio": None, "goal": None,
                 "unit": "every job's figures", "steps": args.steps, "runs": jobs},
    }  # fmt: skip
    console.print(f"written {write_result('repeated_jobs', figures)}")


if __name__ == "__main__":
    main()
