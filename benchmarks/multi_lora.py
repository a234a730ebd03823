"""Three policies as three full models vs as three LoRA adapters of one base: memory, sync bytes.

    python benchmarks/multi_lora.py           # both variants of the multi_agent job, 30 updates
    python benchmarks/multi_lora.py --quick   # 3 updates each
    python benchmarks/multi_lora.py --wide    # + the same job on 1024-wide models, 3 updates
    python benchmarks/multi_lora.py --real    # only the same job on SmolLM2-135M, 3 updates

Runs ``examples/multi_agent`` twice, one variant after the other, each in a subprocess of its
own (one's memory never counts toward the other's):

- ``full`` (``config.yaml``, the baseline): three models, so three engines and two trainers
  (the supervisor and the math worker train, the words worker is served frozen).
- ``lora`` (``config_lora.yaml``): the three policies are adapters of one base, so one engine
  serves the base and every adapter, one trainer holds the base once and trains two adapters.

Both run with ``engine.ray_actors`` so that every engine and every trainer rank is a process of
its own; a sampler thread reads each such process's peak resident memory (``VmHWM``, which
no sampling interval can miss) while the job runs. The driver (rollouts, LangGraph, MLflow) is
the same program in both variants and is reported apart, not in the ratio.

Figures (``benchmarks/results/multi_lora.json``), adapters over full models, one pair per job
(each figure's ``notes`` says which job it is):

- ``memory_ratio``: peak RSS of the engine and trainer processes, summed (goal <= 0.45).
- ``sync_bytes_ratio``: bytes the weight syncs of one update move (both trained policies)
  (goal <= 0.05).

Unsuffixed, the headline: ``--real``, the job on the project's real model, SmolLM2-135M-Instruct
(`agentrl_sdk.models.real.smollm2_path`) for all three policies, where the weights, AdamW state
and activations, not the runtime, fill the memory. Set up as a user would for this model
(examples/word_problems): engines decode in bfloat16, the trainers compute in bfloat16 (FSDP2
mixed precision: float32 parameters and AdamW state), the hermes tool prompt (its ChatML
template ignores tools). The full-model baseline fine-tunes every parameter; the adapters are
rank 16, alpha 32, on q/k/v/o and gate/up/down of every layer (``REAL_LORA``), pushed as
adapters. 3 updates of 2 rows x 4 samples, 16 new tokens per call. So that every trainer updates
(its AdamW state exists) in every update: the rows alternate math / words (unshuffled, so each
batch holds one of each), the supervisor still samples its reply but the graph routes by the
row's kind (`fixed_routing_graph`), and the reward is noise on both trained nodes (every group
has signal); ``optimizer_steps_per_update`` records it. ``rss_by_phase_mb`` gives, per
process, the largest RSS sampled while each actor method ran. Memory and bytes only.

``_tiny``: the job as shipped (0.4 M-parameter models, 30 updates); its runs hold both reward
curves. Each process's memory is mostly its Python, torch and Ray runtime, so its memory ratio
counts processes more than weights, and rank-16 adapters on every linear layer of a 64-wide
model are a large share of its weights.

``_wide`` (``--wide``): random models 1024 wide, 4 layers (53 M parameters, the job's
tokenizer), 3 updates on a random reward; memory and bytes, not learning.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"full": "config.yaml", "lora": "config_lora.yaml"}
ROLES = {"ray::PolicyWorker": "trainer", "ray::_EngineActor": "engine"}


class PeakSampler:
    """Polls this process's descendants; keeps each engine / trainer process's peak RSS."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, VmHWM bytes)
        self.phases: dict[int, dict[str, int]] = {}  # pid -> {method running: max VmRSS seen}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-rss")

    def __enter__(self) -> PeakSampler:  # noqa: PYI034 - Python 3.11: typing.Self is there, but one class
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process(os.getpid())
        while not self._stop.wait(self.interval_s):
            for process in me.children(recursive=True):
                try:
                    title = " ".join(process.cmdline())
                    role = _role(title)
                    if role is not None:
                        self.peaks[process.pid] = (role, _status(process.pid, "VmHWM"))
                        # Ray titles a worker "ray::Class.method" while a call runs
                        method = title.split()[0].partition(".")[2] or "idle"
                        phases = self.phases.setdefault(process.pid, {})
                        phases[method] = max(phases.get(method, 0),
                                             _status(process.pid, "VmRSS"))
                except (psutil.Error, OSError, ValueError):
                    continue  # it ended between the listing and the read: its last peak stays

    def by_role(self) -> dict[str, list[int]]:
        """Peak RSS (bytes) of every process seen, by role."""
        out: dict[str, list[int]] = {"engine": [], "trainer": []}
        for role, peak in self.peaks.values():
            out[role].append(peak)
        return out

    def phases_by_role(self) -> dict[str, list[dict[str, float]]]:
        """Per process, the largest RSS (MiB) sampled while each actor method ran (0.5 s
        samples: a guide to where the peak is, not the peak)."""
        out: dict[str, list[dict[str, float]]] = {"engine": [], "trainer": []}
        for pid, (role, _) in self.peaks.items():
            phases = self.phases.get(pid, {})
            out[role].append({m: round(b / 2**20, 1) for m, b in sorted(phases.items())})
        return out


def _role(title: str) -> str | None:
    return next((role for prefix, role in ROLES.items() if title.startswith(prefix)), None)


def _status(pid: int, field: str) -> int:
    """``VmHWM`` (peak RSS) or ``VmRSS`` of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no {field} for {pid}")


WIDE = {"version": 1, "vocab_size": 1024, "hidden_size": 1024, "num_layers": 4}


def wide_model_path() -> Path:
    """A random model of the job's tokenizer, ``WIDE`` in size (built once, cached)."""
    from agentrl_sdk.models import (
        build_small_tokenizer,
        build_tiny_model,
        cached_build,
        save_pretrained_pair,
    )

    def build(folder: Path) -> None:
        tokenizer = build_small_tokenizer("hermes", vocab_size=WIDE["vocab_size"])
        model = build_tiny_model(tokenizer, hidden_size=WIDE["hidden_size"],
                                 num_layers=WIDE["num_layers"], num_heads=16, num_kv_heads=4)
        save_pretrained_pair(model, tokenizer, folder)

    return cached_build("multi-lora-wide", WIDE, build)


def random_reward(state: dict, row: dict, trajectory: object) -> list:
    """A reward of noise for both trained policies: every group has signal (``--wide``)."""
    import random

    import agentrl_sdk as sdk

    return [sdk.RewardComponent(name="answer", value=random.random(), node="math_worker"),
            sdk.RewardComponent(name="routing", value=random.random(), node="supervisor")]


REAL_LORA = {"rank": 16, "alpha": 32, "dropout": 0.0, "sync": "adapter",
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                "gate_proj", "up_proj", "down_proj"]}  # fmt: skip


def alternating_rows() -> list[dict]:
    """The job's rows, math and words in turn (``--real``: each batch of 2 holds one of each)."""
    from examples.multi_agent.agent import make_mixed_rows

    rows = make_mixed_rows(64, seed=2)
    math = [r for r in rows if r["kind"] == "math"]
    words = [r for r in rows if r["kind"] == "words"]
    return [r for pair in zip(math, words, strict=False) for r in pair]


def fixed_routing_graph() -> object:
    """The job's graph, but the supervisor's sampled reply does not decide the route: the
    row's kind does, so the math worker gets its math rows whatever SmolLM2 writes (``--real``)."""
    from langgraph.graph import END, START, StateGraph

    import agentrl_sdk as sdk
    from examples.multi_agent.agent import State, math_worker, router_prompt, words_worker

    async def supervisor(state: dict) -> dict:
        await sdk.TokenChatModel().ainvoke(router_prompt(state["question"]))
        return {"route": state["kind"]}

    graph = StateGraph(State)
    graph.add_node("supervisor", supervisor)
    graph.add_node("math_worker", math_worker())
    graph.add_node("words_worker", words_worker)
    graph.add_edge(START, "supervisor")
    graph.add_conditional_edges("supervisor", lambda s: s["route"],
                                {"math": "math_worker", "words": "words_worker"})
    graph.add_edge("math_worker", END)
    graph.add_edge("words_worker", END)
    return graph.compile()


def real_config(variant: str) -> dict:
    """The variant's config on SmolLM2-135M for every policy (``--real``), as a dict."""
    import yaml

    from agentrl_sdk.models.real import smollm2_path
    from examples.multi_agent.train import HERE

    raw = yaml.safe_load((HERE / CONFIGS[variant]).read_text())
    path = str(smollm2_path())
    for spec in (raw["model"], *raw["policies"].values()):
        if "adapter_of" not in spec:
            spec.pop("builder", None)
            spec["path"] = path
    raw["engine"]["options"] = {"dtype": "bfloat16"}
    raw["rollout"].update(n=4, concurrency=8)
    raw["rollout"]["sampling"]["max_tokens"] = 16
    raw["rollout"]["chat"] = {"max_context_tokens": 1024, "tool_prompt": "hermes"}
    raw["trainer"].update(dtype="bfloat16", lr=1e-5)
    if "lora" in raw["trainer"]:
        raw["trainer"].update(lora=REAL_LORA, lr=1e-4)
    raw["data"] = {"batch_size": 2, "shuffle": False}
    raw["entrypoint"].update(graph="benchmarks.multi_lora:fixed_routing_graph",
                             dataset="benchmarks.multi_lora:alternating_rows",
                             reward="benchmarks.multi_lora:random_reward")
    return raw


def measure(variant: str, steps: int, wide: bool = False, real: bool = False) -> dict:
    """Train one variant (in this process) and return its memory, sync bytes and curves."""
    import resource

    from agentrl_sdk.pipeline import TrainConfig
    from examples.multi_agent.train import HERE, run

    if real:
        config = TrainConfig.model_validate(real_config(variant))
    else:
        config = TrainConfig.from_yaml(HERE / CONFIGS[variant])
    config.max_steps = steps
    config.engine.ray_actors = True
    if wide:
        path = str(wide_model_path())
        for spec in (config.model, *config.policies.values()):
            if getattr(spec, "adapter_of", None) is None:
                spec.builder, spec.path = None, path
        config.entrypoint.reward = "benchmarks.multi_lora:random_reward"
    work = Path(tempfile.mkdtemp(prefix=f"multi_lora_{variant}_"))
    config.checkpoint.dir = str(work / "checkpoints")
    config.checkpoint.every = 0
    config.tracking.uri = f"sqlite:///{work / 'mlflow.db'}"
    start = time.perf_counter()
    try:
        with PeakSampler() as sampler:
            result = run(config)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints of 3 full models: GBs of disk
    seconds = time.perf_counter() - start
    peaks = sampler.by_role()
    per_policy = {k: v for m in result.history[-1:] for k, v in m.items()
                  if k.startswith("weight_sync/") and k.endswith("bytes")}  # fmt: skip
    sync = [sum(v for k, v in m.items() if k.startswith("weight_sync/") and k.endswith("bytes"))
            for m in result.history]  # fmt: skip
    return {
        "config": f"examples/multi_agent/{CONFIGS[variant]}",
        "engine_processes": len(peaks["engine"]),
        "trainer_processes": len(peaks["trainer"]),
        "engine_peak_rss_mb": [round(p / 2**20, 1) for p in peaks["engine"]],
        "trainer_peak_rss_mb": [round(p / 2**20, 1) for p in peaks["trainer"]],
        "engine_trainer_peak_rss_mb": round(sum(sum(p) for p in peaks.values()) / 2**20, 1),
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sync_bytes_per_update": sync,
        "sync_bytes_last_update": per_policy,
        "optimizer_steps_per_update": [
            {k.removeprefix("train/").removesuffix("optimizer_steps").rstrip("/") or "default": v
             for k, v in m.items() if k.startswith("train/") and k.endswith("optimizer_steps")}
            for m in result.history],
        "rss_by_phase_mb": sampler.phases_by_role() if real else None,
        "reward": [round(m["reward/mean"], 4) for m in result.history],
        "seconds": round(seconds, 1),
    }


JOBS = {
    "": "SmolLM2-135M for all three policies (--real), 3 updates: the headline figures",
    "_tiny": "the multi_agent job as shipped (0.4 M-parameter models), 30 updates: its runs hold "
             "the reward curves; runtimes dominate the memory",
    "_wide": "random 53 M-parameter models (--wide), 3 updates on a random reward",
}  # fmt: skip
"""Which run each figure suffix is (the ``notes`` of its figures)."""


def report(full: dict, lora: dict, suffix: str = "") -> Path:
    """Write the figures: the adapters' run over the full models' run (``suffix``: which job,
    see ``JOBS``; each is merged beside the others)."""
    from benchmarks._results import write_result

    figures = {
        f"memory_ratio{suffix}": _figure(
            lora["engine_trainer_peak_rss_mb"], full["engine_trainer_peak_rss_mb"], 0.45,
            "MiB, peak RSS of the engine and trainer processes, summed"),
        f"sync_bytes_ratio{suffix}": _figure(
            statistics.median(lora["sync_bytes_per_update"]),
            statistics.median(full["sync_bytes_per_update"]), 0.05,
            "bytes moved by one update's weight syncs (median)"),
    }  # fmt: skip
    for figure in figures.values():
        figure["notes"] = JOBS[suffix]
    figures[f"memory_ratio{suffix}"]["runs"] = {"full": full, "lora": lora}
    return write_result("multi_lora", figures, merge=True)


def _figure(value: float, baseline: float, goal: float, unit: str) -> dict:
    return {"value": value, "baseline": baseline,
            "ratio": round(value / baseline, 4) if baseline else None, "goal": goal, "unit": unit}


def _table(full: dict, lora: dict) -> str:
    rows = [("", "3 full models", "3 adapters, 1 base"),
            ("engine processes", full["engine_processes"], lora["engine_processes"]),
            ("trainer processes", full["trainer_processes"], lora["trainer_processes"]),
            ("engine + trainer peak RSS (MiB)", full["engine_trainer_peak_rss_mb"],
             lora["engine_trainer_peak_rss_mb"]),
            ("sync bytes per update (median)", statistics.median(full["sync_bytes_per_update"]),
             statistics.median(lora["sync_bytes_per_update"])),
            ("mean reward, last 10 updates", round(statistics.fmean(full["reward"][-10:]), 3),
             round(statistics.fmean(lora["reward"][-10:]), 3)),
            ("wall seconds", full["seconds"], lora["seconds"])]  # fmt: skip
    return "\n".join(f"{a:<34}{b!s:>16}{c!s:>22}" for a, b, c in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 updates per variant")
    parser.add_argument("--steps", type=int, default=None, help="updates per variant (30)")
    parser.add_argument("--wide", action="store_true", help="also on 1024-wide models")
    parser.add_argument("--wide-only", action="store_true", help="only the wide models")
    parser.add_argument("--real", action="store_true", help="only SmolLM2-135M (3 updates)")
    parser.add_argument("--variant", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 30)
    if args.variant:  # the subprocess of one variant
        measured = measure(args.variant, steps, wide=args.wide_only, real=args.real)
        args.out.write_text(json.dumps(measured, indent=2) + "\n")
        return
    sizes = {"_tiny": []} if not (args.wide or args.wide_only) else {"_wide": ["--wide-only"]}
    if args.wide and not args.wide_only:
        sizes = {"_tiny": [], "_wide": ["--wide-only"]}
    if args.real:
        sizes = {"": ["--real"]}
    for suffix, flags in sizes.items():
        runs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for variant in ("full", "lora"):  # one after the other: they share the CPU
                out = Path(tmp) / f"{variant}.json"
                subprocess.run([sys.executable, __file__, "--variant", variant, "--steps",
                                str((args.steps or 3) if suffix == "" else
                                    3 if suffix == "_wide" else steps), "--out", str(out), *flags],
                               check=True, cwd=ROOT)  # fmt: skip
                runs[variant] = json.loads(out.read_text())
        print(_table(runs["full"], runs["lora"]))
        print(report(runs["full"], runs["lora"], suffix))


if __name__ == "__main__":
    main()
