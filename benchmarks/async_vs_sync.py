"""The same jobs through the sync and the fully-async pipeline, timed as a user feels them.

    python benchmarks/async_vs_sync.py [--quick]

1. **Whole-job wall time.** The long-tail agent of `_waiting_agent` (1, 2 or 6 LLM calls per
   rollout, a lognormal 4- to 48-token budget per call, a tool that waits 300 ms between calls)
   on the demo's warm-started tiny model: embedded TorchEngine, one FSDP2 worker, 4 rows x 4
   samples per update, the same rows and updates in every run. Fully-async runs with
   ``max_staleness`` 1 and 2, for 10 updates (5x the larger bound: the queue filled during
   warm-up cannot carry the result). A job's wall time runs from its first engine request to
   its last update's end (start-up, equal in both, left out).
2. **A true bound.** No schedule can finish faster than its serial trainer work (the sum of its
   updates and weight pushes) or than the engine needs to decode its tokens at its peak
   throughput (measured here at a full batch). ``bound_fraction`` = that lower bound / the
   async wall time: at most 1 by construction.
3. **Time to a reward level on the demo task** (tool selection, 8 rows x 8 samples per
   update, 40 updates as ``make demo``): the wall time until the mean training reward of 5
   consecutive updates reaches 0.38 (the demo's first updates score 0.2-0.35; full
   fine-tuning ends near 0.4), for sync and fully-async (``max_staleness`` 1), and the final
   reward of both (async must not learn worse), as medians of 3 alternating sync / async
   rounds (``--demo-rounds``: one run is noisy). Also the updates each needed to get there, and
   the best speedup any overlap of the sync run's own rollout and trainer phases could give
   (``overlap_bound``): the demo's rollouts wait on no tool, so async gains only what it
   overlaps, and here both phases share 2 cores. ``cpu_bound``: 1 / the share of the cores'
   time the sync runs kept busy (every process; from /proc/stat): doing the same work per
   update, no schedule can beat it on this machine. The fully-async runs' engine takes the
   cores the trainer leaves (``engine.options.cpu_threads``, chosen by the pipeline).

Each pipeline runs as fast as it can here: sync trains on every core (its phases take turns;
with the demo's one CPU per worker a sync update took 2.09 s, with two 1.56 s), fully-async
keeps one core for the trainer and gives the engine the rest (oversubscribed, both slow down).

Figures in ``async_vs_sync.json``: ``async_speedup`` (sync wall / async wall at each
staleness; the best is the figure, goal >= 2.8), ``bound_fraction``, ``time_to_reward_speedup``
(goal >= 2) and ``final_reward`` of both pipelines.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
import agentrl_sdk.pipeline.update as update_module  # noqa: E402
from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from agentrl_sdk.types import SamplingParams  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from benchmarks._waiting_agent import (  # noqa: E402
    answer_reward,
    build_graph,
    graph_input,
    long_tail_rows,
)
from examples.tool_selection import agent as demo  # noqa: E402
from examples.tool_selection.model import model_path  # noqa: E402
from examples.tool_selection.train import HERE  # noqa: E402

SPEEDUP_GOAL, TIME_TO_REWARD_GOAL = 2.8, 2.0
LATENCY_S = 0.3
STALENESS = (1, 2)
REWARD_LEVEL = 0.38
WINDOW = 5


def _busy_cpu_s() -> float:
    """CPU seconds this machine has spent busy (every process: the driver, Ray's trainer)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass
class Timeline:
    """When a job's work happened: its first engine request and each update's end, and the
    machine's busy CPU seconds at both."""

    first_request: float | None = None
    update_ends: list[float] = field(default_factory=list)
    busy_at_first_request: float = 0.0
    busy_at_update_ends: list[float] = field(default_factory=list)

    @property
    def utilization(self) -> float:
        """The share of every core's time the job kept busy (1: no core ever idle)."""
        busy = self.busy_at_update_ends[-1] - self.busy_at_first_request
        return busy / (self.wall_s * (psutil.cpu_count() or 1))

    @property
    def wall_s(self) -> float:
        assert self.first_request is not None
        return self.update_ends[-1] - self.first_request

    def elapsed(self) -> list[float]:
        """Seconds from the first request to each update's end."""
        assert self.first_request is not None
        return [t - self.first_request for t in self.update_ends]


def _train(config: TrainConfig, graph: Any, rows: list[dict], reward: Any,
           input_fn: Any) -> tuple[sdk.TrainResult, Timeline]:
    timeline = Timeline()
    update, generate = update_module.update_policy, TorchEngine.generate

    async def timed_update(policy, step, samples):
        metrics = await update(policy, step, samples)
        timeline.update_ends.append(time.perf_counter())
        timeline.busy_at_update_ends.append(_busy_cpu_s())
        return metrics

    async def first_request(self, *args, **kwargs):
        if timeline.first_request is None:
            timeline.first_request = time.perf_counter()
            timeline.busy_at_first_request = _busy_cpu_s()
        return await generate(self, *args, **kwargs)

    update_module.update_policy, TorchEngine.generate = timed_update, first_request
    try:
        result = sdk.train(graph, rows, reward=reward, config=config, input_fn=input_fn)
    finally:
        update_module.update_policy, TorchEngine.generate = update, generate
    return result, timeline


def _config(steps: int, rows: int, samples: int, staleness: int | None) -> TrainConfig:
    """The demo's config; each pipeline set up as fast as it runs on this machine's CPUs."""
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.model.path = str(model_path())
    config.max_steps = steps
    config.evaluation.every = 0
    config.data.batch_size = rows
    config.rollout.n = samples
    config.checkpoint.dir = None
    config.tracking.enabled = False
    if staleness is not None:  # the trainer keeps one core, the engine gets the others
        config.pipeline = "fully_async"
        config.fully_async.max_staleness = staleness
    else:  # rollouts and updates take turns: the trainer computes on every core
        cores = len(os.sched_getaffinity(0))
        config.trainer = config.trainer.model_copy(update={"num_cpus_per_worker": cores})
    return config


def peak_tokens_per_s(rounds: int = 3) -> float:
    """The engine's best decode throughput: a full batch of 64 requests, 48 tokens each."""
    engine = TorchEngine.from_pretrained(str(model_path()))
    ids = [[10 + (7 * i + j) % 900 for j in range(60)] for i in range(64)]
    sampling = SamplingParams(temperature=1.0, max_tokens=48, seed=0)

    async def one_round() -> float:
        start = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(p, sampling, f"peak-{i}")
                                         for i, p in enumerate(ids)))
        return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)

    try:
        return max(asyncio.run(one_round()) for _ in range(rounds))
    finally:
        engine.close()


def _serial_trainer_s(result: sdk.TrainResult) -> float:
    return sum(m.get("time/train_s", 0.0) + m.get("time/weight_sync_s", 0.0)
               for m in result.history)


def _tokens(result: sdk.TrainResult) -> float:
    return sum(m.get("rollout/generated_tokens", 0.0) for m in result.history)


def _rolling(values: list[float]) -> list[float | None]:
    """The mean of each full window of ``WINDOW`` updates (None before the first)."""
    return [statistics.fmean(values[i - WINDOW + 1: i + 1]) if i >= WINDOW - 1 else None
            for i in range(len(values))]


def _overlap_bound(result: sdk.TrainResult) -> float:
    """The best speedup over this sync run that overlapping its rollouts with its updates
    could give (each update's rollout phase and trainer phase run at once, nothing slower):
    sum(rollout + train + sync) / sum(max(rollout, train + sync)). On 2 cores both phases
    compete for the same CPUs, so even this is optimistic."""
    serial = overlapped = 0.0
    for m in result.history:
        rollout = m.get("time/rollout_s", 0.0)
        trainer = m.get("time/train_s", 0.0) + m.get("time/weight_sync_s", 0.0)
        serial += rollout + trainer
        overlapped += max(rollout, trainer)
    return serial / overlapped if overlapped else 0.0


def _updates_to(level: float, result: sdk.TrainResult) -> int | None:
    """The first update whose window mean reaches ``level`` (1-based), if any."""
    rolling = _rolling([m["reward/mean"] for m in result.history])
    return next((i + 1 for i, r in enumerate(rolling) if r is not None and r >= level), None)


def _time_to(level: float, result: sdk.TrainResult, timeline: Timeline) -> float | None:
    rolling = _rolling([m["reward/mean"] for m in result.history])
    return next((t for r, t in zip(rolling, timeline.elapsed(), strict=True)
                 if r is not None and r >= level), None)


def main(quick: bool, demo_rounds: int = 3) -> None:
    console = Console()
    steps = 6 if quick else 10
    rows = long_tail_rows(256, seed=1)
    graph = build_graph(LATENCY_S)
    sync, sync_time = _train(_config(steps, 4, 4, None), graph, rows, answer_reward, graph_input)
    asyncs = {s: _train(_config(steps, 4, 4, s), graph, rows, answer_reward, graph_input)
              for s in STALENESS}
    peak = peak_tokens_per_s()

    table = Table(title=f"{steps} updates of 16 rollouts (4 rows x 4), tools wait "
                        f"{LATENCY_S * 1000:.0f} ms, long-tail calls and lengths")  # fmt: skip
    for column in ("pipeline", "wall s", "speedup", "lower bound s", "bound fraction"):
        table.add_column(column)
    table.add_row("sync", f"{sync_time.wall_s:.1f}", "1.00x", "", "")
    speedups, fractions = {}, {}
    for s, (result, timeline) in asyncs.items():
        bound = max(_serial_trainer_s(result), _tokens(result) / peak)
        speedups[s] = sync_time.wall_s / timeline.wall_s
        fractions[s] = bound / timeline.wall_s
        table.add_row(f"fully_async, max_staleness {s}", f"{timeline.wall_s:.1f}",
                      f"{speedups[s]:.2f}x", f"{bound:.1f}", f"{fractions[s]:.2f}")
    console.print(table)
    console.print(f"engine peak: {peak:.0f} tok/s at a full batch")

    demo_steps = 8 if quick else 40
    demo_rows = demo.training_rows()
    level = REWARD_LEVEL
    rounds = []  # alternating: sync then fully_async, demo_rounds times
    for _ in range(demo_rounds):
        rounds.append({
            "sync": _train(_config(demo_steps, 8, 8, None), demo.build_graph(), demo_rows,
                           demo.right_tool_reward, demo.graph_input),
            "fully_async": _train(_config(demo_steps, 8, 8, 1), demo.build_graph(), demo_rows,
                                  demo.right_tool_reward, demo.graph_input),
        })
    names = ("sync", "fully_async")
    inf = float("inf")  # a run that never reached the level
    times = {k: [_time_to(level, *rd[k]) or inf for rd in rounds] for k in names}
    finals_by_round = {k: [statistics.fmean(m["reward/mean"] for m in rd[k][0].history[-WINDOW:])
                           for rd in rounds] for k in names}  # fmt: skip
    median_time = {k: statistics.median(v) for k, v in times.items()}
    reached = {k: (v if v != inf else None) for k, v in median_time.items()}
    finals = {k: statistics.median(v) for k, v in finals_by_round.items()}
    reward_speedup = (reached["sync"] / reached["fully_async"]
                      if reached["sync"] and reached["fully_async"] else 0.0)
    table = Table(title=f"demo task, {demo_steps} updates of 64 rollouts: time to a mean reward "
                        f"of {level:.2f} over {WINDOW} updates")  # fmt: skip
    for column in ("round", "pipeline", "time to level s", "final reward", "wall s"):
        table.add_column(column)
    for i, rd in enumerate(rounds):
        for name in names:
            t = times[name][i]
            table.add_row(str(i + 1), name, f"{t:.1f}" if t != inf else "not reached",
                          f"{finals_by_round[name][i]:.3f}", f"{rd[name][1].wall_s:.1f}")
    console.print(table)
    overlap_bound = statistics.median(_overlap_bound(rd["sync"][0]) for rd in rounds)
    utilization = {k: statistics.median(rd[k][1].utilization for rd in rounds) for k in names}
    cpu_bound = 1 / utilization["sync"]
    updates_to = {k: [_updates_to(level, rd[k][0]) for rd in rounds] for k in names}
    console.print(f"time-to-reward speedup (medians of {demo_rounds} alternating rounds): "
                  f"{reward_speedup:.2f}x (overlap bound of the sync runs' phases "
                  f"{overlap_bound:.2f}x; the sync runs kept {utilization['sync']:.0%} of the "
                  f"cores busy, async {utilization['fully_async']:.0%}: no schedule of the same "
                  f"work per update beats {cpu_bound:.2f}x; updates to the level {updates_to})")

    best = max(speedups, key=speedups.get)
    written = write_result("async_vs_sync", {
        "async_speedup": {
            "value": round(speedups[best], 4), "baseline": 1.0,
            "ratio": round(speedups[best], 4), "goal": SPEEDUP_GOAL,
            "unit": "sync wall s / fully_async wall s (first request to last update)",
            "max_staleness": best, "updates": steps, "rollouts_per_update": 16,
            "tool_latency_s": LATENCY_S, "sync_wall_s": round(sync_time.wall_s, 3),
            "by_staleness": {str(s): round(v, 4) for s, v in speedups.items()},
            "dropped_stale": {str(s): r.history[-1].get("async/dropped_stale", 0.0)
                              for s, (r, _) in asyncs.items()},
        },
        "bound_fraction": {
            "value": round(fractions[best], 4), "baseline": 1.0,
            "ratio": round(fractions[best], 4), "goal": 1.0,
            "unit": "max(serial trainer s, tokens / peak tok/s) / fully_async wall s (<= 1)",
            "peak_tokens_per_s": round(peak, 1),
            "by_staleness": {str(s): round(v, 4) for s, v in fractions.items()},
        },
        "time_to_reward_speedup": {
            "value": round(reward_speedup, 4), "baseline": 1.0,
            "ratio": round(reward_speedup, 4), "goal": TIME_TO_REWARD_GOAL,
            "unit": f"sync s / fully_async s to a {WINDOW}-update mean training reward of "
                    f"{REWARD_LEVEL} (demo task, max_staleness 1)",
            "level": round(level, 4),
            "seconds": {k: (round(v, 2) if v else None) for k, v in reached.items()},
            "rounds": demo_rounds,
            "seconds_by_round": {k: [round(v, 2) if v != inf else None for v in vs]
                                 for k, vs in times.items()},  # fmt: skip
            "updates_to_level": updates_to,
            "overlap_bound": round(overlap_bound, 4),
            "cpu_bound": round(cpu_bound, 4),
            "utilization": {k: round(v, 4) for k, v in utilization.items()},
        },
        "final_reward": {
            "value": round(finals["fully_async"], 4), "baseline": round(finals["sync"], 4),
            "ratio": round(finals["fully_async"] / finals["sync"], 4) if finals["sync"] else 0.0,
            "goal": 1.0, "unit": f"mean reward of the last {WINDOW} updates, fully_async / sync",
            "updates": demo_steps,
        },
    })  # fmt: skip
    console.print(f"wrote {written}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates (CI smoke run)")
    parser.add_argument("--demo-rounds", type=int, default=None,
                        help="alternating sync/async rounds on the demo task (3; 1 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.demo_rounds or (1 if args.quick else 3))
