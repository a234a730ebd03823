"""What per-request MLflow traces add to a served graph's request latency.

    python benchmarks/serve_overhead.py [--quick]

The tool-selection agent (the demo's warm-started 1k-vocab tiny model on the embedded
TorchEngine, greedy, so every request of a row samples the same tokens) is served twice on the
same engine, by two `GraphServer`s on loopback: one writing a trace per request to a sqlite
MLflow store, one serving without traces. Requests alternate between the two, one at a time,
each timed by the client from sending the request to reading the whole answer; a pair is the
same request served both ways. The figure is the median over pairs of traced latency /
untraced latency (goal: under 1.02; the rows' answers differ in length, so pairing keeps each
comparison to one request); the medians of each variant and of the per-pair differences are
shown beside it. The trace is built and written after the answer, so its cost reaches the
requests that follow (on this 2-core machine, the writer process and the engine share the
cores). Every traced request's trace must be written (checked at the end).

This tiny model answers in tens of milliseconds, so a fixed cost per request weighs far more
here than beside a real model's seconds: the ratio is an upper bound for larger models.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
from agentrl_sdk.engines import create_engine  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from examples.tool_selection.agent import build_graph, graph_input, make_rows  # noqa: E402
from examples.tool_selection.model import model_path  # noqa: E402
from examples.tool_selection.train import HERE  # noqa: E402

GOAL = 1.02


async def main(quick: bool) -> None:
    pairs = 40 if quick else 200
    path = str(model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    rollout = TrainConfig.from_yaml(HERE / "config.yaml").rollout
    rollout = rollout.model_copy(update={
        "sampling": rollout.sampling.model_copy(update={"temperature": 0.0}), "timeout_s": 120.0})
    bodies = [{"input": graph_input(row)} for row in make_rows(8, seed=5)]
    uri = f"sqlite:///{Path(tempfile.mkdtemp()) / 'mlflow.db'}"
    engine = create_engine("torch", path)
    traced = sdk.GraphServer(build_graph(), engine, tokenizer=tokenizer, rollout=rollout,
                             config=sdk.ServeConfig(port=0, tracking_uri=uri,
                                                    experiment="serve-overhead"))
    untraced = sdk.GraphServer(build_graph(), engine, tokenizer=tokenizer, rollout=rollout,
                               config=sdk.ServeConfig(port=0, tracking_uri=None))
    times: dict[str, list[float]] = {"traced": [], "untraced": []}
    try:
        async with traced, untraced, httpx.AsyncClient(timeout=120) as client:
            servers = {"traced": traced.url, "untraced": untraced.url}

            async def ask(variant: str, body: dict) -> float:
                started = time.perf_counter()
                reply = await client.post(f"{servers[variant]}/invoke", json=body)
                elapsed = time.perf_counter() - started
                assert reply.status_code == 200, reply.text
                return elapsed

            for body in bodies:  # warm-up: engine, templates, the store, the writer process
                for variant in servers:
                    await ask(variant, body)
            for i in range(pairs):
                body = bodies[i % len(bodies)]
                order = ("traced", "untraced") if i % 2 == 0 else ("untraced", "traced")
                for variant in order:
                    times[variant].append(await ask(variant, body))
        counts = traced.traces.counts if traced.traces is not None else {}
    finally:
        engine.close()
    expected = pairs + len(bodies)
    assert counts["traces_written"] == expected, f"traces: {counts}, expected {expected}"

    median = {k: statistics.median(v) for k, v in times.items()}
    diffs = [a - b for a, b in zip(times["traced"], times["untraced"], strict=True)]
    ratio = statistics.median(a / b for a, b in zip(times["traced"], times["untraced"],
                                                    strict=True))
    table = Table(title=f"Request latency, {pairs} alternating pairs (tool-selection agent, "
                        "tiny model, greedy)")
    for col in ("variant", "median ms", "p90 ms", "vs untraced (median pair)", "goal"):
        table.add_column(col)
    for name, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        table.add_row(name, f"{median[name] * 1e3:.1f}", f"{p90 * 1e3:.1f}",
                      f"{ratio:.3f}x" if name == "traced" else "1.000x",
                      f"< {GOAL:.2f}x" if name == "traced" else "")
    Console(width=120).print(table)
    print(f"median paired difference: {statistics.median(diffs) * 1e3:.2f} ms; "
          f"traces written: {counts['traces_written']}, lost: {counts['traces_lost']}")
    written = write_result("serve_overhead", {"serve_tracing_overhead": {
        "value": round(ratio, 4), "baseline": 1.0, "ratio": round(ratio, 4), "goal": GOAL,
        "unit": "traced / untraced request latency (median over pairs)",
        "baseline_name": "the same requests served without traces, alternating, same run",
        "pairs": pairs, "traced_median_ms": round(median["traced"] * 1e3, 2),
        "untraced_median_ms": round(median["untraced"] * 1e3, 2),
        "median_paired_difference_ms": round(statistics.median(diffs) * 1e3, 3),
        "traces_written": counts["traces_written"], "traces_lost": counts["traces_lost"],
    }})
    print(f"wrote {written}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    asyncio.run(main(parser.parse_args().quick))
