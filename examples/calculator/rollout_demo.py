"""Rollout demo: run the calculator agent on a few rows and print token-exact trajectories.

    python -m examples.calculator.rollout_demo [--rows 3] [--n 2]
"""

from __future__ import annotations

import argparse
import asyncio

from rich.console import Console

import agentrl_sdk as sdk
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.tracing import legend, render_trajectory
from examples.calculator.agent import build_graph, make_rows
from examples.calculator.model import load_agent_model


async def main(rows: int, n: int) -> None:
    console = Console()
    console.print("[bold]Building or loading the tiny calculator policy…")
    model, tokenizer = load_agent_model()
    engine = TorchEngine(model)
    config = sdk.RolloutConfig(n=n, sampling=sdk.SamplingParams(temperature=0.7, max_tokens=48, seed=0))
    try:
        trajectories = await sdk.arollout_batch(
            build_graph(), make_rows(rows, seed=7), engine, tokenizer=tokenizer, config=config
        )
    finally:
        engine.close()
    console.print(legend())
    for traj in trajectories:
        console.print(render_trajectory(traj, tokenizer, show_prompt=False))
        answer = traj.final_state["messages"][-1].content if traj.final_state else None
        console.print(f"final answer: {answer!r}\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.n))
