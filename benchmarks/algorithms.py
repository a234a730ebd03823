"""GRPO vs PPO with a critic vs GRPO with dynamic sampling on the demo task, same wall clock.

    python benchmarks/algorithms.py [--quick | --minutes M]

The tool-selection demo (``examples/tool_selection/config.yaml``: the warm-started tiny policy,
8 rows x 8 samples per update, lr 0.002) trained three ways, one after the other, each for the
same wall-clock budget counted from its first engine request (start-up, equal but for the
critic's workers, left out; 15 min each, 90 s with ``--quick``):

- ``grpo``: the demo as it is (the baseline);
- ``ppo_critic``: ``examples/tool_selection/config_ppo.yaml``: ``advantage_estimator: gae``
  (gamma = lambda = 1, whitened) with a critic started from the policy's weights
  (``critic: {lr: 0.003, warmup_updates: 2}``, 2 epochs over each batch), updated after the
  policy on the same CPU (untuned);
- ``grpo_dynamic_sampling``: GRPO with ``algorithm.dynamic_sampling`` (DAPO): groups whose
  rewards all agree are dropped and more rows are rolled out to fill the batch.

A run is stopped once its budget is spent (a Ctrl-C to itself: the step in progress finishes
or is dropped); only updates that ended within the budget count. Per arm: updates done,
``final reward`` (mean training reward of its last ``WINDOW`` updates), ``start reward`` (its
first ``WINDOW``) and ``reward/min`` = (final - start) / budget minutes. Figures in
``algorithms.json``: each arm's final reward and reward/min against GRPO's (ratio, goal >= 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
import agentrl_sdk.pipeline.loop as loop_module  # noqa: E402
from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from examples.tool_selection import agent as demo  # noqa: E402
from examples.tool_selection.model import model_path  # noqa: E402
from examples.tool_selection.train import HERE  # noqa: E402

ARMS = ("grpo", "ppo_critic", "grpo_dynamic_sampling")
GOAL = 1.0


@dataclass
class Run:
    """One arm's updates within its budget."""

    rewards: list[float] = field(default_factory=list)  # reward/mean of each counted update
    ends: list[float] = field(default_factory=list)  # seconds from the first request
    updates_past_budget: int = 0


def _config(arm: str, max_steps: int) -> TrainConfig:
    config = TrainConfig.from_yaml(HERE / ("config_ppo.yaml" if arm == "ppo_critic" else
                                           "config.yaml"))
    config.model.path = str(model_path())
    config.max_steps = max_steps
    config.evaluation.every = 0
    config.checkpoint.dir = None
    config.tracking.enabled = False
    if arm == "grpo_dynamic_sampling":
        config.algorithm.dynamic_sampling.enabled = True
    return config


def _train(arm: str, budget_s: float, max_steps: int) -> Run:
    """Train ``arm`` until ``budget_s`` after its first engine request (or ``max_steps``)."""
    run = Run()
    started: list[float] = []
    update, generate = loop_module.update_policies, TorchEngine.generate
    timer = threading.Timer(budget_s, os.kill, (os.getpid(), signal.SIGINT))

    async def first_request(self, *args, **kwargs):
        if not started:
            started.append(time.perf_counter())
            timer.start()
        return await generate(self, *args, **kwargs)

    async def timed_update(*args, **kwargs):
        metrics = await update(*args, **kwargs)
        run.ends.append(time.perf_counter() - started[0])
        return metrics

    loop_module.update_policies, TorchEngine.generate = timed_update, first_request
    try:
        result = sdk.train(demo.build_graph(), demo.training_rows(), reward=demo.right_tool_reward,
                           config=_config(arm, max_steps), input_fn=demo.graph_input)
    finally:
        timer.cancel()
        loop_module.update_policies, TorchEngine.generate = update, generate
    within = [end <= budget_s for end in run.ends[: len(result.history)]]
    run.rewards = [m["reward/mean"] for m, ok in zip(result.history, within, strict=False) if ok]
    run.ends = [e for e, ok in zip(run.ends, within, strict=False) if ok]
    run.updates_past_budget = len(result.history) - len(run.rewards)
    return run


def main(quick: bool, minutes: float | None = None) -> None:
    console = Console()
    budget_s = 60.0 * minutes if minutes else 90.0 if quick else 900.0
    window = 2 if quick else 5
    runs = {arm: _train(arm, budget_s, max_steps=1000) for arm in ARMS}

    stats = {}
    for arm, run in runs.items():
        final = statistics.fmean(run.rewards[-window:]) if run.rewards else float("nan")
        start = statistics.fmean(run.rewards[:window]) if run.rewards else float("nan")
        stats[arm] = {"updates": len(run.rewards), "final": final, "start": start,
                      "per_min": (final - start) / (budget_s / 60)}
    table = Table(title=f"demo task, {budget_s / 60:g} min of wall clock per arm from the first "
                        f"request (8 rows x 8 samples per update)")  # fmt: skip
    for column in ("arm", "updates", "start reward", "final reward", "reward/min",
                   "final vs grpo"):
        table.add_column(column)
    base = stats["grpo"]
    for arm, s in stats.items():
        table.add_row(arm, str(s["updates"]), f"{s['start']:.3f}", f"{s['final']:.3f}",
                      f"{s['per_min']:+.4f}", f"{_ratio(s['final'], base['final']):.2f}x")
    console.print(table)
    console.print(f"final / start reward: mean of the last / first {window} updates' training "
                  "reward; reward/min = (final - start) / budget minutes")

    figures = {}
    for arm in ARMS[1:]:
        s = stats[arm]
        common = {"budget_s": budget_s, "window": window, "updates": s["updates"],
                  "baseline_updates": base["updates"],
                  "rewards": [round(r, 4) for r in runs[arm].rewards],
                  "baseline_rewards": [round(r, 4) for r in runs["grpo"].rewards],
                  "quick": quick}
        figures[f"{arm}_final_reward"] = {
            "value": round(s["final"], 4), "baseline": round(base["final"], 4),
            "ratio": round(_ratio(s["final"], base["final"]), 4), "goal": GOAL,
            "unit": f"mean training reward of the last {window} updates within the budget, "
                    "vs grpo", **common,
        }  # fmt: skip
        figures[f"{arm}_reward_per_min"] = {
            "value": round(s["per_min"], 5), "baseline": round(base["per_min"], 5),
            "ratio": round(_ratio(s["per_min"], base["per_min"]), 4), "goal": GOAL,
            "unit": "(final - start reward) per minute of the budget, vs grpo", "quick": quick,
        }  # fmt: skip
    console.print(f"wrote {write_result('algorithms', figures)}")


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else 0.0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="90 s per arm (a smoke run)")
    parser.add_argument("--minutes", type=float, default=None, help="budget per arm (15)")
    args = parser.parse_args()
    main(args.quick, args.minutes)
