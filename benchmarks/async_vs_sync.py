"""The same training job through the sync and the fully-async pipeline, in one run.

    python benchmarks/async_vs_sync.py [--quick]

The long-tail agent of `_waiting_agent` (1, 2 or 6 LLM calls per rollout, a 4- to 48-token
budget per call, lognormal; a tool that waits 300 ms between calls) trains on the demo's
warm-started tiny model: embedded TorchEngine, one FSDP2 worker under Ray, 4 rows x 4 samples
per step, tracking off. Both pipelines run the same steps on the same rows with the same
settings; fully-async runs with ``max_staleness: 8`` (the long tail lasts that many async
steps: a tighter bound drops slow groups) and a weight push after every update.

A step is the time between two consecutive update ends (the first, warm-up step left out).
Two bounds, both from the sync run's measurements:

- the *overlap bound* (the issue's figure): perfect overlap of the measured generation and
  update, ``(generate + train) / max(generate, train)``. The async pipeline can beat it: a sync
  step also holds the engine idle while rollouts wait on tools and on the slowest rollout, and
  the async rollouter fills that time with the next rows.
- the *engine bound* (stricter): ``sync step / max(engine busy, train)``, where *engine busy*
  is the time the engine spent prefilling and decoding a step's rollouts
  (`TorchEngine.busy_seconds`): a pipeline that kept the engine saturated and hid every tool
  wait and the whole tail could go no faster.

Figures in ``async_vs_sync.json``: ``async_speedup`` (sync step time / async step time, goal
>= 2), ``bound_fraction`` (speedup / overlap bound, goal >= 0.9) and ``engine_bound_fraction``
(speedup / engine bound; the same 0.9 as a yardstick).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
import agentrl_sdk.pipeline.job as job_module  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig, TrainResult  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from benchmarks._waiting_agent import (  # noqa: E402
    answer_reward,
    build_graph,
    graph_input,
    long_tail_rows,
)
from examples.tool_selection.model import model_path  # noqa: E402
from examples.tool_selection.train import HERE  # noqa: E402

SPEEDUP_GOAL = 2.0
BOUND_GOAL = 0.9
LATENCY_S = 0.3
# A 6-call rollout lasts several async steps: a bound that covers the tail trains it (a tighter
# one drops the slow groups, training a biased, cheaper sample).
MAX_STALENESS = 8


def _config(steps: int, pipeline: str) -> TrainConfig:
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.model.path = str(model_path())
    config.max_steps = steps
    config.evaluation.every = 0  # no held-out rows here
    config.data.batch_size = 4
    config.rollout.n = 4
    config.rollout.sampling = config.rollout.sampling.model_copy(update={"max_tokens": 48})
    config.checkpoint.dir = None
    config.tracking.enabled = False
    config.pipeline = pipeline  # type: ignore[assignment]
    config.fully_async.max_staleness = MAX_STALENESS
    return config


def _train(
    config: TrainConfig, rows: list[dict]
) -> tuple[TrainResult, list[float], list[float]]:
    """Train; returns the result, and the wall time and engine busy seconds at the end of every
    update."""
    update_ends: list[float] = []
    busy: list[float] = []
    update = job_module.update_policy

    async def timed(policy, step, samples):
        metrics = await update(policy, step, samples)
        update_ends.append(time.perf_counter())
        busy.append(policy.engine.busy_seconds)
        return metrics

    job_module.update_policy = timed  # both pipelines update through it (one policy here)
    try:
        result = sdk.train(build_graph(LATENCY_S), rows, reward=answer_reward, config=config,
                           input_fn=graph_input)  # fmt: skip
    finally:
        job_module.update_policy = update
    return result, update_ends, busy


def _per_step(marks: list[float]) -> float:
    """Mean growth of ``marks`` per step, from the first (warm-up) update end on."""
    return (marks[-1] - marks[0]) / (len(marks) - 1)


def main(quick: bool) -> None:
    steps = 4 if quick else 10
    rows = long_tail_rows(256, seed=1)
    console = Console()
    sync, sync_ends, sync_busy = _train(_config(steps, "sync"), rows)
    fully_async, async_ends, async_busy = _train(_config(steps, "fully_async"), rows)

    warm = sync.history[1:]
    generate = statistics.mean(m["time/rollout_s"] for m in warm)
    train = statistics.mean(m["time/train_s"] + m["time/weight_sync_s"] for m in warm)
    busy = _per_step(sync_busy)
    sync_step, async_step = _per_step(sync_ends), _per_step(async_ends)
    bound = (generate + train) / max(generate, train)
    engine_bound = sync_step / max(busy, train)
    speedup = sync_step / async_step
    utilisation = {"sync": busy / sync_step, "fully_async": _per_step(async_busy) / async_step}
    history = fully_async.history
    dropped = history[-1]["async/dropped_stale"]
    staleness = max(m["staleness/max"] for m in history)

    table = Table(title=f"{steps} steps of 16 rollouts (4 rows x 4), tools wait "
                        f"{LATENCY_S * 1000:.0f} ms, long-tail calls and lengths")  # fmt: skip
    for column in ("pipeline", "s / step", "engine busy", "speedup", "goal"):
        table.add_column(column)
    table.add_row("sync (generate, then update)", f"{sync_step:.2f}",
                  f"{utilisation['sync']:.0%}", "1.00x", "")  # fmt: skip
    table.add_row(f"fully_async (max_staleness {MAX_STALENESS})", f"{async_step:.2f}",
                  f"{utilisation['fully_async']:.0%}", f"{speedup:.2f}x",
                  f">= {SPEEDUP_GOAL:.1f}x")  # fmt: skip
    table.add_row(f"overlap bound (generate {generate:.2f}s, train {train:.2f}s)", "", "",
                  f"{bound:.2f}x", "")  # fmt: skip
    table.add_row("speedup / overlap bound", "", "", f"{speedup / bound:.2f}",
                  f">= {BOUND_GOAL:.1f}")  # fmt: skip
    table.add_row(f"engine bound (engine busy {busy:.2f}s, train {train:.2f}s)", "", "",
                  f"{engine_bound:.2f}x", "")  # fmt: skip
    table.add_row("speedup / engine bound", "", "", f"{speedup / engine_bound:.2f}",
                  f"({BOUND_GOAL:.1f})")  # fmt: skip
    console.print(table)
    console.print(f"fully_async: staleness max {staleness:.0f}, dropped stale groups {dropped:.0f}")
    written = write_result("async_vs_sync", {
        "async_speedup": {
            "value": round(speedup, 4), "baseline": 1.0, "ratio": round(speedup, 4),
            "goal": SPEEDUP_GOAL, "unit": "sync s/step / fully_async s/step",
            "sync_step_s": round(sync_step, 4), "async_step_s": round(async_step, 4),
            "steps": steps, "rollouts_per_step": 16, "tool_latency_s": LATENCY_S,
            "dropped_stale": dropped, "max_staleness_seen": staleness,
        },
        "bound_fraction": {
            "value": round(speedup / bound, 4), "baseline": 1.0,
            "ratio": round(speedup / bound, 4), "goal": BOUND_GOAL,
            "unit": "speedup / (generate + train) / max(generate, train)",
            "bound": round(bound, 4), "generate_s": round(generate, 4), "train_s": round(train, 4),
        },
        "engine_bound_fraction": {
            "value": round(speedup / engine_bound, 4), "baseline": 1.0,
            "ratio": round(speedup / engine_bound, 4), "goal": BOUND_GOAL,
            "unit": "speedup / (sync step / max(engine busy, train))",
            "bound": round(engine_bound, 4), "engine_busy_s": round(busy, 4),
            "train_s": round(train, 4),
            "engine_utilisation": {k: round(v, 4) for k, v in utilisation.items()},
        },
    })  # fmt: skip
    console.print(f"wrote {written}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI smoke run)")
    main(parser.parse_args().quick)
