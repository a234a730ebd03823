"""Does the demo learn with LoRA as well as with full fine-tuning? Both runs, measured.

    python benchmarks/demo_lora.py full    # make demo (examples/tool_selection/config.yaml)
    python benchmarks/demo_lora.py lora    # the same job with trainer.lora (config_lora.yaml)
    python benchmarks/demo_lora.py report  # both runs done: write the figures

Run the two one after the other, never together: they share the CPU. Each run saves its
curves to ``runs/demo_lora_{full,lora}.json``; ``report`` reads both.

Figures (``benchmarks/results/demo_lora.json``):

- ``lora_final_reward``: mean training reward of LoRA's last 10 updates (``baseline`` = full
  fine-tuning's; goal ratio >= 0.9). One update's reward (64 rollouts) swings by ~0.1 between updates.
- ``lora_heldout_final``: LoRA's held-out greedy reward after the last update (``baseline`` =
  full fine-tuning's; goal ratio >= 0.9).
- ``sync_bytes_ratio``: bytes of one LoRA push (the adapters) over one full push (goal <= 0.05).

``lora_final_reward`` also holds both runs' curves (reward per update, held-out reward by
updates done, bytes per push, wall seconds), and any other runs saved as
``runs/demo_lora_{full,lora}_*.json`` (e.g. another lr) under ``other_runs``. Wall time depends on the shared
machine's load; reward per update does not (runs match to float non-determinism).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from examples.tool_selection.train import HERE, run  # noqa: E402

CONFIGS = {"full": HERE / "config.yaml", "lora": HERE / "config_lora.yaml"}
RUNS = Path("runs")


def measure(variant: str, steps: int | None) -> dict:
    """Train one variant of the demo and return its curves, push sizes and wall time."""
    config = TrainConfig.from_yaml(CONFIGS[variant])
    if steps:
        config.max_steps = steps
    start = time.perf_counter()
    result = run(config)
    seconds = time.perf_counter() - start
    return {
        "config": str(CONFIGS[variant].relative_to(HERE.parents[1])),
        "lr": config.trainer.lr,
        "lora": config.trainer.lora.model_dump() if config.trainer.lora else None,
        "reward": [round(m["reward/mean"], 4) for m in result.history],
        "sync_bytes": [int(m["weight_sync/bytes"]) for m in result.history
                       if "weight_sync/bytes" in m],
        "heldout": {e.step: round(e.metrics["reward/mean"], 4) for e in result.evaluations},
        "seconds": round(seconds, 1),
        "run_id": result.run_id,
    }


def report(full: dict, lora: dict, others: dict[str, dict]) -> Path:
    """Write the figures comparing the LoRA run with the full fine-tuning run."""
    def last10(run: dict) -> float:
        return round(statistics.fmean(run["reward"][-10:]), 4)

    def final_heldout(run: dict) -> float:
        return run["heldout"][str(max(int(k) for k in run["heldout"]))]

    curves = {"full": full, "lora": lora}
    figures = {
        "lora_final_reward": _figure(last10(lora), last10(full), 0.9,
                                     "mean training reward/mean, last 10 updates"),
        "lora_heldout_final": _figure(final_heldout(lora), final_heldout(full), 0.9,
                                      "held-out greedy reward/mean after the last update"),
        "sync_bytes_ratio": _figure(statistics.median(lora["sync_bytes"]),
                                    statistics.median(full["sync_bytes"]), 0.05,
                                    "bytes per weight-sync push"),
    }
    figures["lora_final_reward"]["runs"] = curves
    figures["lora_final_reward"]["other_runs"] = others
    return write_result("demo_lora", figures)


def _figure(value: float, baseline: float, goal: float, unit: str) -> dict:
    return {"value": value, "baseline": baseline,
            "ratio": round(value / baseline, 4) if baseline else None, "goal": goal, "unit": unit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["full", "lora", "report"])
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    RUNS.mkdir(exist_ok=True)
    if args.what == "report":
        runs = [json.loads((RUNS / f"demo_lora_{v}.json").read_text()) for v in ("full", "lora")]
        others = {p.stem.removeprefix("demo_lora_"): json.loads(p.read_text())
                  for p in sorted(RUNS.glob("demo_lora_*_*.json"))}
        print(report(*runs, others))
        return
    measured = measure(args.what, args.steps)
    (RUNS / f"demo_lora_{args.what}.json").write_text(json.dumps(measured, indent=2) + "\n")
    print(json.dumps(measured))


if __name__ == "__main__":
    main()
