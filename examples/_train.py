"""What every example's ``train.py`` does: resolve its config, train, print the reward curve."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

import agentrl_sdk as sdk
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.pipeline import TrainConfig, TrainResult


def run(config: TrainConfig) -> TrainResult:
    """Build (or reuse) the example's policy and train it as ``config`` says."""
    job = resolve_entrypoints(config)
    return sdk.train(job.graph, job.dataset, reward=job.reward, config=config,
                     input_fn=job.input_fn, eval_dataset=job.eval_dataset)


def summarize(result: TrainResult, console: Console) -> tuple[float, float]:
    """Print the reward curve; return the mean reward of the first and the last 5 steps."""
    curve = [m["reward/mean"] for m in result.history]
    first, last = _mean(curve[:5]), _mean(curve[-5:])
    console.print("[bold]reward per step:[/] " + " ".join(f"{r:.2f}" for r in curve))
    console.print(
        f"[bold]mean reward, first 5 steps {first:.3f} -> last 5 steps {last:.3f} "
        f"({last / first if first else float('inf'):.1f}x)[/] · MLflow run {result.run_id} · "
        f"final model {result.final_model}"
    )
    if result.evaluations:
        console.print("[bold]held-out evaluation (greedy), by updates done:[/] " + " · ".join(
            f"{e.step}: reward {e.metrics['reward/mean']:.3f}" for e in result.evaluations))
    return first, last


def main(default_config: Path, description: str) -> None:
    """The command line of an example's ``train.py``: ``[--config PATH] [--steps N]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", type=Path, default=default_config)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    config = TrainConfig.from_yaml(args.config)
    if args.steps:
        config.max_steps = args.steps
    Path("runs").mkdir(exist_ok=True)
    summarize(run(config), Console())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
