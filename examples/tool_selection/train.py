"""Train the tool-selection agent with GRPO on this CPU and watch the reward rise.

    python -m examples.tool_selection.train [--steps 30] [--config examples/tool_selection/config.yaml]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

import agentrl_sdk as sdk
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import build_graph, graph_input, make_rows, right_tool_reward
from examples.tool_selection.model import model_path

HERE = Path(__file__).parent


def main(config_path: Path, steps: int | None) -> None:
    console = Console()
    config = TrainConfig.from_yaml(config_path)
    config.model.path = str(model_path())
    if steps:
        config.max_steps = steps
    Path("runs").mkdir(exist_ok=True)
    result = sdk.train(build_graph(), make_rows(256, seed=2), reward=right_tool_reward,
                       config=config, input_fn=graph_input)
    curve = [round(m["reward/mean"], 3) for m in result.history]
    console.print(f"[bold]reward per step:[/] {curve}")
    first, last = _mean(curve[:3]), _mean(curve[-3:])
    console.print(
        f"[bold]mean reward: first 3 steps {first:.3f} -> last 3 steps {last:.3f} "
        f"({last / first if first else float('inf'):.1f}x)[/] · MLflow run {result.run_id} "
        f"in {config.tracking.uri} · final model {result.final_model}"
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=HERE / "config.yaml")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    main(args.config, args.steps)
