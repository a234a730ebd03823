"""Does a change keep what the demo learns? The tiny demo's reward per update, against a recorded one.

    python benchmarks/reward_curve.py --record   # measure and record the reference curve
    python benchmarks/reward_curve.py            # measure again and compare with it

The job is ``make demo`` (``examples/tool_selection/config.yaml``) cut to its first
``--steps`` updates (20), seeded as the config is, without held-out evaluation or checkpoints
(they do not change the updates), tracking into a temporary folder. A refactor that keeps
behaviour keeps this curve: the same rollouts, rewards and updates. Two runs of one commit on one
machine give the same curve to the last digit; another CPU's kernels sum in their own order, so
the comparison allows ``--tolerance`` (0.1) on each update's mean reward and asserts the curves'
means agree within a quarter of it.

Figures (``benchmarks/results/reward_curve.json``):

- ``reward_mean_first_updates``: the mean of the curve (``baseline`` = the recorded curve's
  mean; goal ratio 1.0 within noise), with the curve itself (``curve``), which the comparison
  reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, uninstalled (its own package first)

from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from benchmarks._results import RESULTS_DIR, write_result  # noqa: E402
from examples.tool_selection.train import HERE, run  # noqa: E402

RESULT = RESULTS_DIR / "reward_curve.json"


def measure(steps: int) -> list[float]:
    """The demo's ``reward/mean`` for each of its first ``steps`` updates."""
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = steps
    with tempfile.TemporaryDirectory() as folder:
        config.evaluation.every = 0
        config.checkpoint.dir = None
        config.tracking.uri = f"sqlite:///{folder}/mlflow.db"
        result = run(config)
    return [round(m["reward/mean"], 4) for m in result.history]


def recorded() -> list[float]:
    """The reference curve in the result file."""
    figures = json.loads(RESULT.read_text())["figures"]
    return next(f["curve"] for f in figures if f["name"] == "reward_mean_first_updates")


def compare(curve: list[float], reference: list[float], tolerance: float) -> list[str]:
    """Where ``curve`` leaves ``reference`` (empty: it reproduces it)."""
    problems = []
    if len(curve) != len(reference):
        problems.append(f"{len(curve)} updates, the reference has {len(reference)}")
    for step, (got, want) in enumerate(zip(curve, reference, strict=False), start=1):
        if abs(got - want) > tolerance:
            problems.append(f"update {step}: reward {got:.4f}, reference {want:.4f}")
    drift = abs(statistics.fmean(curve) - statistics.fmean(reference))
    if drift > tolerance / 4:
        problems.append(f"mean reward {statistics.fmean(curve):.4f}, reference "
                        f"{statistics.fmean(reference):.4f}")  # fmt: skip
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="record this run as the reference")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.1)
    args = parser.parse_args()
    curve = measure(args.steps)
    print("reward per update:", " ".join(f"{r:.3f}" for r in curve))
    if args.record:
        mean = round(statistics.fmean(curve), 4)
        write_result("reward_curve", {"reward_mean_first_updates": {
            "value": mean, "baseline": mean, "baseline_name": "this recorded curve",
            "ratio": 1.0, "goal": "1.0 within noise (the reference for later runs)",
            "unit": f"mean reward/mean of the first {args.steps} updates",
            "curve": curve,
        }})  # fmt: skip
        print(f"recorded as the reference in {RESULT.relative_to(ROOT)}")
        return
    problems = compare(curve, recorded(), args.tolerance)
    print("reproduces the reference" if not problems else "\n".join(problems))
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
