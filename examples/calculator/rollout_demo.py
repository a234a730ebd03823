"""Rollout demo: run the calculator agent on a few rows and print token-exact trajectories.

    python -m examples.calculator.rollout_demo [--rows 3] [--n 2] [--out trajectories.jsonl]

The saved file can be looked at again with ``agentrl show FILE --model-dir DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from pathlib import Path

from rich.console import Console

import agentrl_sdk as sdk
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.tracing import legend, render_trajectory
from examples.calculator.agent import build_graph, make_rows
from examples.calculator.model import load_agent_model


async def main(rows: int, n: int, out: Path) -> None:
    console = Console()
    console.print("[bold]Building or loading the tiny calculator policy…")
    model, tokenizer = load_agent_model()
    data = make_rows(rows, seed=7)
    engine = TorchEngine(model)
    config = sdk.RolloutConfig(n=n, sampling=sdk.SamplingParams(temperature=0.7, max_tokens=48, seed=0))
    try:
        trajectories = await sdk.arollout_batch(
            build_graph(), data, engine, tokenizer=tokenizer, config=config
        )
    finally:
        engine.close()
    console.print(legend())
    expected = {row["id"]: row["answer"] for row in data}
    correct = 0
    for traj in trajectories:
        console.print(render_trajectory(traj, tokenizer, show_prompt=False))
        answer = traj.final_state["messages"][-1].content if traj.final_state else None
        correct += answer == f"The answer is {expected[traj.row_id]}."
        console.print(f"final answer: {answer!r} (expected {expected[traj.row_id]})\n")
    out.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    statuses = Counter(t.status for t in trajectories)
    console.print(
        f"[bold]{len(trajectories)} rollouts[/] · statuses {dict(statuses)} · "
        f"correct {correct}/{len(trajectories)} (the untrained policy guesses the numbers; "
        f"training is what fixes that) · saved to {out}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("trajectories.jsonl"))
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.n, args.out))
