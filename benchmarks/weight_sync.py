"""Weight sync from the trainer to engines in other processes: speed against memory bandwidth,
and what it costs the driver.

    python benchmarks/weight_sync.py [--quick] [--rounds N]

A `TrainerGroup` (one rank) pushes its weights to 1 and to 2 torch engines, each in its own
Ray actor, two ways, alternating round by round:

- ``shared_memory`` (engines on rank 0's machine): rank 0 writes each gathered bucket into
  files it keeps in /dev/shm and overwrites in place; every engine maps them and loads its
  parameters from them. Only file names cross the driver.
- ``object_store`` (the way engine actors on other machines take; here
  ``transport="object_store"``): rank 0 puts each bucket in its object store, the actors
  fetch them. Only object references cross the driver.
- ``collective`` (``transport="collective"``; NCCL on GPUs, gloo here): rank 0 and the actors
  form a push group; each bucket is one broadcast.
- ``driver`` (``WeightSync(transport="driver")``, the only way before): the buckets are assembled
  in the driver and shipped to each engine through Ray's object store.

Figures (``benchmarks/results/weight_sync.json``):

- ``bandwidth_fraction``: model bytes / median push wall time (trainer's gather to the last
  engine's new version), divided by this machine's memcpy bandwidth measured in the same run
  (copy between two touched 256 MB buffers, on every core; the median of one sample per
  round, as single samples ranged 19-38 GB/s here); for the >= 100M model, the worse of 1
  and 2 engines (goal >= 0.5). Each engine must receive the bytes, so 2 engines move twice as much
  data in the same wall time budget.
- ``driver_peak_buckets``: the driver's peak RSS growth over 3 direct pushes (shared memory,
  object store or collective, the largest; measured before any driver-way push, whose freed
  buckets would stay in the heap and hide growth), in buckets (sampled every millisecond from
  /proc; goal < 2). The driver way's growth is reported beside it.

Run it on a quiet machine: both figures are ratios, but the pushes share 2 cores with the
engines' and the trainer's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

import torch  # noqa: E402
from _results import write_result  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl_sdk.engines.ray import RayEngine  # noqa: E402
from agentrl_sdk.models import build_small_tokenizer, build_tiny_model, save_pretrained_pair  # noqa: E402
from agentrl_sdk.trainer import TrainerConfig, TrainerGroup, WeightSync, init_ray  # noqa: E402

BUCKET_BYTES = 256 << 20  # the default of WeightSync and TrainerGroup
GOAL_FRACTION = 0.5
TIMED_PUSHES = 2  # per way and round, after one untimed push
GOAL_BUCKETS = 2.0


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """This machine's copy bandwidth: bytes copied per second between two touched buffers."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakRss:
    """The driver's peak resident memory while the block runs, sampled every millisecond."""

    def __enter__(self) -> PeakRss:
        self.before = self.peak = rss_bytes()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.before


def models(quick: bool, root: Path) -> list[tuple[str, str]]:
    """(name, folder): a tiny model and (unless quick) SmolLM2-135M."""
    tok = build_small_tokenizer()
    tiny = build_tiny_model(tok, hidden_size=256, num_layers=4)
    out = [("tiny", str(save_pretrained_pair(tiny, tok, root / "tiny")))]
    if not quick:
        from agentrl_sdk.models.real import smollm2_path

        out.append(("smollm2-135m", str(smollm2_path())))
    return out


async def push_rounds(
    group: TrainerGroup, engines: list[RayEngine], rounds: int, memcpy: list[float]
) -> dict[str, dict[str, Any]]:
    """The driver's memory first, each way on its own (the direct ways before any driver
    push: once freed, the driver way's buckets stay in the heap and would hide later growth),
    then alternating rounds: memcpy (appended to ``memcpy``), then each way in turn, one
    untimed push (switching ways frees and allocates the previous way's copies, which a job,
    using one way throughout, never does) and `TIMED_PUSHES` timed ones. Medians."""
    ways = {
        "shared_memory": WeightSync(BUCKET_BYTES),
        "object_store": WeightSync(BUCKET_BYTES, transport="object_store"),
        "collective": WeightSync(BUCKET_BYTES, transport="collective"),
        "driver": WeightSync(BUCKET_BYTES, transport="driver"),
    }
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    growth: dict[str, list[int]] = {way: [] for way in ways}

    async def push(way: str) -> None:
        stats = await ways[way].push(group.weights, engines, engines[0].policy_version + 1)
        assert stats.via == way

    for way in ways:  # 3 pushes each (both file sets written, then one in place)
        start = rss_bytes()
        for _ in range(3):
            with PeakRss() as rss:
                await push(way)
            growth[way].append(rss.peak - start)
    for _ in range(rounds):  # unsampled: the RSS sampler's thread would take a core's share
        memcpy.append(memcpy_gbps())
        for way in ways:
            await push(way)
            for _ in range(TIMED_PUSHES):
                await push(way)
                seconds[way].append(ways[way].last_stats.total_s)
    nbytes = ways["shared_memory"].last_stats.bytes
    return {
        way: {
            "bytes": nbytes,
            "buckets": ways[way].last_stats.buckets,
            "median_s": statistics.median(seconds[way]),
            "gbps": nbytes / statistics.median(seconds[way]) / 1e9,
            "driver_peak_growth_bytes": max(growth[way]),
            "driver_peak_buckets": max(growth[way]) / BUCKET_BYTES,
        }
        for way in ways
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model only, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds per way")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 7)
    console = Console()
    init_ray(TrainerConfig())
    memcpy = [memcpy_gbps()]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in models(args.quick, Path(tmp)):
            group = TrainerGroup(path, TrainerConfig(world_size=1))
            try:
                for count in (1, 2):
                    engines = [RayEngine("torch", path) for _ in range(count)]  # at version 0
                    key = f"{name}/{count}_engines"
                    try:
                        results[key] = asyncio.run(push_rounds(group, engines, rounds, memcpy))
                    finally:
                        for engine in engines:
                            engine.close()
                    for way, row in results[key].items():
                        console.print(f"{key} {way}: {row['median_s'] * 1e3:.0f} ms, "
                                      f"{row['gbps']:.2f} GB/s, driver "
                                      f"+{row['driver_peak_buckets']:.2f} buckets")  # fmt: skip
            finally:
                group.shutdown()
    bandwidth = statistics.median(memcpy)  # one sample per round, between the pushes
    console.print(f"memcpy: median {bandwidth:.1f} GB/s of {len(memcpy)} "
                  f"({min(memcpy):.1f}-{max(memcpy):.1f})")  # fmt: skip
    for ways in results.values():
        for row in ways.values():
            row["bandwidth_fraction"] = row["gbps"] / bandwidth
    report(console, results, bandwidth, args.quick)


def report(console: Console, results: dict[str, dict[str, Any]], bandwidth: float, quick: bool) -> None:
    table = Table(title=f"weight sync (memcpy {bandwidth:.1f} GB/s, buckets {BUCKET_BYTES >> 20} MB)")
    for column in ("model / engines", "way", "MB", "median ms", "GB/s", "of memcpy", "driver +buckets"):
        table.add_column(column)
    for key, ways in results.items():
        for way, row in ways.items():
            table.add_row(key, way, f"{row['bytes'] / 1e6:.0f}", f"{row['median_s'] * 1e3:.0f}",
                          f"{row['gbps']:.2f}", f"{row['bandwidth_fraction']:.2f}",
                          f"{row['driver_peak_buckets']:.2f}")  # fmt: skip
    console.print(table)
    large = [k for k in results if not k.startswith("tiny/")] or list(results)
    fraction = min(results[k]["shared_memory"]["bandwidth_fraction"] for k in large)
    direct = ("shared_memory", "object_store", "collective")
    driver = max(results[k][way]["driver_peak_buckets"] for k in results for way in direct)
    old_driver = max(results[k]["driver"]["driver_peak_buckets"] for k in results)
    old_fraction = min(results[k]["driver"]["bandwidth_fraction"] for k in large)
    figures = {
        "bandwidth_fraction": {
            "value": round(fraction, 3), "baseline": round(bandwidth, 2), "ratio": round(fraction, 3),
            "goal": GOAL_FRACTION,
            "unit": "model bytes/s of a shared-memory push over memcpy GB/s (baseline), worse "
                    "of 1 and 2 engines, largest model",
            "driver_path": round(old_fraction, 3),
        },
        "driver_peak_buckets": {
            "value": round(driver, 3), "baseline": round(old_driver, 3), "ratio": None,
            "goal": GOAL_BUCKETS,
            "unit": "driver peak RSS growth during a direct push, in buckets (baseline: the "
                    "driver way)",
        },
        "runs": {"value": results, "quick": quick, "bucket_bytes": BUCKET_BYTES},
    }  # fmt: skip
    console.print(f"wrote {write_result('weight_sync', figures)}")


if __name__ == "__main__":
    main()
