"""Serve -> feedback -> train -> serve the new version, on the tool-selection agent.

    python -m examples.production_loop.loop [--requests 512] [--rated 0.5]

The tool-selection agent (its warm-started tiny model, which picks the right tool about half
the time) is served with `sdk.GraphServer` for ``--requests`` requests, one MLflow trace each.
A rule standing in for users rates a share of them (``correct``: did the agent call the tool
the question asks for?) with `mlflow.log_feedback`. The rated traces then train the model
three ways, each from the served model: off-policy RL on the traced tokens
(`sdk.train_on_traces`), fine-tuning on the best (`sdk.finetune_on_traces`), and replaying the
traced prompts on-policy (`sdk.train`). Each result is evaluated greedily on held-out
questions, beside the served model.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import mlflow
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import (
    OPERATIONS,
    build_graph,
    graph_input,
    held_out_rows,
    make_rows,
    right_tool_reward,
)
from examples.tool_selection.model import model_path
from examples.tool_selection.train import HERE as TOOL_SELECTION

EXPERIMENT = "tool-selection-served"
_QUESTION = re.compile(r"What is \d+ (\S+) \d+\?")


@dataclass
class Outcome:
    """One way of training on the traces: what it cost and what it gained."""

    mode: str
    held_out_reward: float
    minutes: float
    trained_tokens: int
    final_model: str
    details: dict[str, Any] = field(default_factory=dict)


def config(model: str | Path, folder: Path) -> TrainConfig:
    """The tool-selection demo's config on ``model``, trained in this process, writing below
    ``folder``."""
    data = TrainConfig.from_yaml(TOOL_SELECTION / "config.yaml").model_dump(exclude_unset=True)
    data.pop("entrypoint", None)
    data["model"] = {"path": str(model)}
    data["trainer"] = {**data.get("trainer", {}), "placement": "in_process"}
    data["checkpoint"] = {"dir": str(folder / "checkpoints"), "every": 0}
    data["tracking"] = {"uri": f"sqlite:///{folder / 'mlflow.db'}", "experiment": "production-loop"}
    data["evaluation"] = {"every": 0}
    return TrainConfig.model_validate(data)


async def serve_requests(uri: str, requests: int, seed: int = 11) -> dict[str, int]:
    """``requests`` questions sent to the served agent over HTTP, 16 at a time (sampled at the
    demo's temperature, as a deployed policy explores); the server's trace counts and the
    answers' HTTP statuses (a request whose agent failed is answered 500 and traced too)."""
    path = str(model_path())
    rollout = config(path, Path("runs")).rollout
    engine = create_engine("torch", path)
    server = sdk.GraphServer(
        build_graph(), engine, tokenizer=AutoTokenizer.from_pretrained(path, local_files_only=True),
        rollout=rollout, config=sdk.ServeConfig(port=0, tracking_uri=uri, experiment=EXPERIMENT),
    )  # fmt: skip
    rows = make_rows(requests, seed=seed)
    gate = asyncio.Semaphore(16)
    answers: Counter[int] = Counter()
    try:
        async with server, httpx.AsyncClient(timeout=300) as client:
            async def ask(row: dict[str, Any]) -> None:
                async with gate:
                    reply = await client.post(f"{server.url}/invoke",
                                              json={"input": graph_input(row)})
                    answers[reply.status_code] += 1  # 500: the agent failed (e.g. looped)

            await asyncio.gather(*(ask(row) for row in rows))
        counts = dict(server.traces.counts) if server.traces is not None else {}
        return {**counts, **{f"http_{code}": n for code, n in sorted(answers.items())}}
    finally:
        engine.close()


def expected_tool(record: sdk.TraceRecord) -> str | None:
    """The tool the traced question asks for, read from its text as a user would."""
    messages = (record.inputs or {}).get("messages") or []
    found = _QUESTION.search(str(messages[-1].get("content", ""))) if messages else None
    return OPERATIONS.get(found.group(1)) if found else None


def called_right_tool(record: sdk.TraceRecord) -> bool:
    """The rule standing in for users: the agent's first tool call is the one asked for."""
    for message in (record.outputs or {}).get("messages") or []:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            return calls[0].get("name") == expected_tool(record)
    return False


def rate(uri: str, share: float, seed: int = 0) -> int:
    """``correct`` feedback from the rule on ``share`` of the served traces; how many."""
    mlflow.set_tracking_uri(uri)
    records = sdk.traces(uri, experiment=EXPERIMENT).records
    rated = random.Random(seed).sample(records, round(len(records) * share))
    for record in rated:
        mlflow.log_feedback(trace_id=record.trace_id, name="correct",
                            value=called_right_tool(record))
    return len(rated)


def held_out(model: str, folder: Path) -> float:
    """Greedy reward/mean of ``model`` on the demo's held-out questions."""
    cfg = config(model, folder)
    result = sdk.evaluate(build_graph(), held_out_rows(), right_tool_reward, cfg,
                          input_fn=graph_input)
    return result.metrics["reward/mean"]


def by_task(record: sdk.TraceRecord) -> str:
    """Advantages compare traces of the same operation."""
    return expected_tool(record) or "unknown"


def off_policy(selection: sdk.TraceSelection, folder: Path) -> Outcome:
    """Off-policy RL on the rated traces of the current weights, grouped by operation."""
    started = time.perf_counter()
    result = sdk.train_on_traces(selection.recent(max_version_lag=0), config(model_path(), folder),
                                 group=by_task, epochs=2, samples_per_update=64,
                                 output_dir=folder)  # fmt: skip
    tokens = sum(sum(s.response_mask) for s in result.samples)  # per epoch
    return Outcome("off-policy RL on the traced tokens", held_out(result.final_model, folder),
                   (time.perf_counter() - started) / 60, tokens, result.final_model,
                   {"updates": len(result.updates), "samples": len(result.samples)})


def fine_tune(selection: sdk.TraceSelection, folder: Path) -> Outcome:
    """Supervised fine-tuning on the traces rated correct."""
    started = time.perf_counter()
    result = sdk.finetune_on_traces(selection, model_path(), folder, min_reward=1.0, steps=60,
                                    lr=2e-3, batch_size=8)
    tokens = result.learned_tokens
    return Outcome("fine-tuning on the best traces", held_out(result.final_model, folder),
                   (time.perf_counter() - started) / 60, tokens, result.final_model,
                   {"exact": len(result.exact), "retokenized": len(result.retokenized)})


def replay(selection: sdk.TraceSelection, folder: Path, steps: int) -> Outcome:
    """GRPO on the traced questions, rolled out afresh."""
    started = time.perf_counter()
    rows = [{**row, "tool": by_task_of_row(row)} for row in selection.rows()]
    cfg = config(model_path(), folder).model_copy(update={"max_steps": steps})
    result = sdk.train(build_graph(), rows, right_tool_reward, cfg, input_fn=graph_input)
    tokens = int(sum(m.get("tokens/generated", 0.0) for m in result.history))
    return Outcome("replaying the traced prompts on-policy", held_out(result.final_model, folder),
                   (time.perf_counter() - started) / 60, tokens, str(result.final_model),
                   {"steps": result.steps, "rows": len(rows)})


def by_task_of_row(row: dict[str, Any]) -> str | None:
    """The tool a replayed row's question asks for (the reward's ground truth)."""
    found = _QUESTION.search(str(row["messages"][-1]["content"]))
    return OPERATIONS.get(found.group(1)) if found else None


def run(folder: Path, requests: int, share: float, replay_steps: int) -> dict[str, Any]:
    """The whole loop in ``folder``; the figures of each mode beside the served model's."""
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'served.db'}"
    started = time.perf_counter()
    counts = asyncio.run(serve_requests(uri, requests))
    served_minutes = (time.perf_counter() - started) / 60
    rated = rate(uri, share)
    selection = sdk.traces(uri, experiment=EXPERIMENT, reward="correct")
    baseline = held_out(str(model_path()), folder / "served")
    outcomes = [off_policy(selection, folder / "off_policy"),
                fine_tune(selection, folder / "fine_tune"),
                replay(selection, folder / "replay", replay_steps)]
    return {"requests": requests, "rated": rated, "selection": selection.counts,
            "serve_counts": counts, "serve_minutes": served_minutes,
            "served_held_out_reward": baseline, "outcomes": outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--rated", type=float, default=0.5, help="share of traces rated")
    parser.add_argument("--replay-steps", type=int, default=12)
    parser.add_argument("--dir", type=Path, default=Path("runs/production_loop"))
    args = parser.parse_args()
    report = run(args.dir, args.requests, args.rated, args.replay_steps)
    print(f"served {report['requests']} requests, rated {report['rated']}: "
          f"held-out reward of the served model {report['served_held_out_reward']:.3f}")
    for o in report["outcomes"]:
        print(f"{o.mode}: held-out {o.held_out_reward:.3f} "
              f"({o.held_out_reward - report['served_held_out_reward']:+.3f}), "
              f"{o.minutes:.1f} min, {o.trained_tokens} trained tokens")


if __name__ == "__main__":
    main()
