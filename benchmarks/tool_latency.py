"""Are tool waits hidden? 64 concurrent rollouts whose tools wait 200 ms, against the same
rollouts with instant tools (the engine-only time).

    python benchmarks/tool_latency.py [--quick]

The agent of `_waiting_agent` (an LLM call, a tool, an LLM call; a long tail of 4-256 tokens
per call, median 40) runs on a random tiny model (it uses its token budgets) in the embedded
TorchEngine: 16 rows x 4 samples, seeded so both variants sample the same tokens. While one
rollout waits for its tool, the engine decodes the others; a wait costs wall time only on the
critical path (the longest rollout's). With short answers (median 10 tokens) the engine-only
time is ~0.55 s and the waits show more (1.16x measured): what can hide a wait is the engine
work around it. Rounds alternate the variants; the fastest round of each counts (other jobs
share this machine).

Figure ``tool_hiding``: time with 200 ms tools / engine-only time (goal <= 1.1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from agentrl_sdk.config import RolloutConfig  # noqa: E402
from agentrl_sdk.engines import create_engine  # noqa: E402
from agentrl_sdk.rollout import arollout_batch  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from benchmarks._waiting_agent import build_graph, graph_input, long_tail_rows  # noqa: E402
from agentrl_sdk.models import (  # noqa: E402
    build_small_tokenizer,
    build_tiny_model,
    cached_build,
    save_pretrained_pair,
)

GOAL = 1.10
LATENCY_S = 0.2
MAX_TOKENS = 256


def model_folder() -> Path:
    """A randomly initialised tiny model (hidden 64, 2 layers, small BPE): like a real policy
    early in training, it rarely ends a response before its token budget."""

    def build(folder: Path) -> None:
        tokenizer = build_small_tokenizer("hermes")
        save_pretrained_pair(build_tiny_model(tokenizer, hidden_size=64, num_layers=2),
                             tokenizer, folder)  # fmt: skip

    return cached_build("tool-latency-tiny", {"hidden": 64, "layers": 2}, build)


async def main(quick: bool) -> None:
    rounds = 2 if quick else 5
    path = str(model_folder())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    rows = long_tail_rows(16, seed=3, calls=2, max_tokens=MAX_TOKENS, median_tokens=40)
    config = RolloutConfig.model_validate(
        {"n": 4, "concurrency": 64, "sampling": {"temperature": 1.0, "max_tokens": MAX_TOKENS, "seed": 0}}
    )
    graphs = {"engine_only": build_graph(0.0), "tools_200ms": build_graph(LATENCY_S)}
    engine = create_engine("torch", path, max_batch_size=64)
    times: dict[str, list[float]] = {name: [] for name in graphs}
    tokens: dict[str, int] = {}
    try:
        for name, graph in graphs.items():  # warm-up
            await arollout_batch(graph, rows, engine, tokenizer=tokenizer, config=config,
                                 input_fn=graph_input)  # fmt: skip
        for _ in range(rounds):
            for name, graph in graphs.items():
                started = time.perf_counter()
                trajectories = await arollout_batch(
                    graph, rows, engine, tokenizer=tokenizer, config=config, input_fn=graph_input
                )
                times[name].append(time.perf_counter() - started)
                tokens[name] = sum(len(c.response_ids) for t in trajectories for c in t.calls)
    finally:
        engine.close()

    best = {name: min(values) for name, values in times.items()}
    ratio = best["tools_200ms"] / best["engine_only"]
    waits = sum(r["calls"] - 1 for r in rows) * config.n
    table = Table(title=f"{len(rows) * config.n} concurrent rollouts, {waits} tool waits of "
                        f"{LATENCY_S * 1000:.0f} ms ({rounds} rounds, fastest)")  # fmt: skip
    for column in ("variant", "wall s", "generated tokens", "vs engine-only", "goal"):
        table.add_column(column)
    table.add_row("engine only (instant tools)", f"{best['engine_only']:.3f}",
                  str(tokens["engine_only"]), "1.000x", "")  # fmt: skip
    table.add_row("tools wait 200 ms", f"{best['tools_200ms']:.3f}", str(tokens["tools_200ms"]),
                  f"{ratio:.3f}x", f"<= {GOAL:.2f}x")  # fmt: skip
    Console().print(table)
    written = write_result("tool_latency", {
        "tool_hiding": {
            "value": round(ratio, 4), "baseline": 1.0, "ratio": round(ratio, 4), "goal": GOAL,
            "unit": "time with 200 ms tools / engine-only time",
            "seconds": round(best["tools_200ms"], 4),
            "engine_only_seconds": round(best["engine_only"], 4),
            "rollouts": len(rows) * config.n, "tool_waits": waits,
        },
    })  # fmt: skip
    print(f"wrote {written}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI smoke run)")
    asyncio.run(main(parser.parse_args().quick))
