"""Environments nobody here wrote: reasoning-gym tasks trained on SmolLM2-135M-Instruct, and the
same task with TRL's GRPOTrainer.

    python benchmarks/environments.py --tasks products,basic_arithmetic [--steps 96]
    python benchmarks/environments.py --tasks chain_sum --trl --trl-steps 10  # + TRL, alternating
    python benchmarks/environments.py --probe basic_arithmetic,chain_sum     # the starting pass@1 only

Each task comes from `agentrl_sdk.environments.reasoning_gym`: training rows from seed 1,
held-out rows from a disjoint seed range, the task's own ``score_answer`` on the last
``<answer>`` tag as the reward. ``heldout_before`` and ``heldout_after`` are greedy pass@1 (%)
of ``sdk.evaluate`` on the held-out rows, of the starting model and of the trained one.
``minutes`` is the wall time of the training call alone (start-up, rollouts, updates, weight
sync, the final export; no evaluation).

The starting model is SmolLM2-135M-Instruct warm-started on the task's own generated
examples (`examples.reasoning_gym.model`: question -> ``<answer>X</answer>``, seeds far from
both ranges): zero-shot it never writes the tag, so every reward would be 0.

With ``--trl``, TRL's ``GRPOTrainer`` (CPU, HF generate, no vLLM) trains the same model from
the same start on the same rows in the same order, with the same reward function, prompts,
samples per prompt, prompts per step, max new tokens, learning rate, clip range, trained
layers (the last ``TRAINABLE_LAYERS`` decoder layers and the final norm), no KL and one
optimizer step per batch; its final model is evaluated by the same ``sdk.evaluate`` call. The
two sides alternate (ours, TRL, ours, TRL...) so a drifting load hits both. TRL takes about
ten times our time per update here, so ``--trl-steps`` gives it fewer updates: what is compared
is the held-out gain per training minute, not the gain after a number of updates. Ours runs the
real-model demo's recipe (bfloat16 where native, the rank in this process, prefix-tree
packing); TRL runs float32 (its CPU default).

Figures: per task ``<task>_heldout_gain`` (points; with ``heldout_before``, ``heldout_after``,
``minutes``, ``generated_tokens``), ``tasks_gaining_15`` (goal 2) and
``vs_trl_gain_per_minute`` (ours over TRL's held-out points per minute, goal 1.5). The
``details`` of the result file keep a ``tasks`` and a ``games`` mapping: `record` adds one
entry (textarena's games are recorded through it by their own benchmark).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import RESULTS_DIR, write_result  # noqa: E402

NAME = "environments"
EVAL_SEED = 100_000
GAIN_GOAL, RATIO_GOAL = 15.0, 1.5
TRAINABLE_LAYERS = 6
JOB = {"prompts_per_step": 6, "n": 8, "max_tokens": 32, "lr": 1e-4, "eval_rows": 64,
       "clip_low": 0.2, "clip_high": 0.28}
"""The GRPO job both sides run (per step: prompts x n completions)."""

TASKS: dict[str, dict[str, Any]] = {
    "chain_sum": {"max_terms": 3, "max_digits": 2},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 5},
    "products": {"max_digits": 2},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "basic_arithmetic": {"max_terms": 3, "max_digits": 2, "operators": ["+", "-", "*"],
                         "allow_parentheses": False, "allow_negation": False},
    "word_sequence_reversal": {"max_words": 4},
}
"""The tasks measured and their generator options (reasoning-gym's own, made small enough
for a 135M model to solve some of them); a task not listed runs with its defaults."""


# ------------------------------------------------------------------------------ results


def _load() -> dict[str, Any]:
    path = RESULTS_DIR / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def record(kind: Literal["tasks", "games"], name: str, entry: dict[str, Any]) -> Path:
    """Add one task's or game's measurement to ``results/environments.json`` (its other
    entries kept) and refresh the summary figures.

    Args:
        kind: ``"tasks"`` (reasoning-gym) or ``"games"`` (textarena).
        name: The task or game.
        entry: At least ``heldout_before``, ``heldout_after`` (points, e.g. % pass@1 or win
            rate), ``minutes`` and ``generated_tokens``; ``unit`` says what the points are.
    """
    if kind not in ("tasks", "games"):
        raise ValueError(f"kind must be 'tasks' or 'games', got {kind!r}")
    missing = {"heldout_before", "heldout_after", "minutes", "generated_tokens"} - set(entry)
    if missing:
        raise ValueError(f"the entry for {name!r} lacks {sorted(missing)}")
    details = _load().get("details", {})
    table = dict(details.get(kind, {}))
    gain = round(entry["heldout_after"] - entry["heldout_before"], 1)
    table[name] = {**entry, "heldout_gain": gain}
    prefix = "" if kind == "tasks" else "game_"
    figures: dict[str, dict[str, Any]] = {
        kind: table,  # not a number: kept under details
        f"{prefix}{name}_heldout_gain": {
            "value": gain, "unit": f"points of {entry.get('unit', 'held-out pass@1 (%)')}",
            "baseline": entry["heldout_before"], "goal": GAIN_GOAL,
            "baseline_name": "held-out score before RL, same run",
            **{k: entry[k] for k in ("heldout_before", "heldout_after", "minutes",
                                     "generated_tokens") if k in entry},
        },
    }
    if kind == "tasks":
        gaining = sorted(n for n, e in table.items() if e["heldout_gain"] >= GAIN_GOAL
                         and e["minutes"] <= 15)
        figures["tasks_gaining_15"] = {
            "value": len(gaining), "unit": "reasoning-gym tasks +15 points within 15 minutes",
            "baseline": len(table), "baseline_name": "tasks measured", "goal": 2,
            "tasks": gaining,
        }
    return write_result(NAME, figures, merge=True)


def record_vs_trl(task: str, ours: dict[str, Any], trl: dict[str, Any], rounds: int) -> Path:
    """The held-out points per minute of ours over TRL's on the same task and job, and the
    wall time of one update (rollouts, update, weight sync) of each."""
    def rate(side: dict[str, Any]) -> float:
        return (side["heldout_after"] - side["heldout_before"]) / side["minutes"]

    def update_seconds(side: dict[str, Any]) -> float:
        return 60 * side["minutes"] / side["steps"]

    ours_rate, trl_rate = rate(ours), rate(trl)
    ratio = round(ours_rate / trl_rate, 3) if trl_rate > 0 else None
    figures = {
        "vs_trl_gain_per_minute": {
            "value": round(ours_rate, 3), "baseline": round(trl_rate, 3), "ratio": ratio,
            "goal": RATIO_GOAL, "unit": f"held-out points per training minute ({task})",
            "baseline_name": "TRL GRPOTrainer, same task and job, alternating runs",
            "task": task, "rounds": rounds,
            "ours": ours, "trl": trl,
            "note": None if ratio is not None else "TRL's held-out gain was <= 0: no ratio",
        },
        "vs_trl_seconds_per_update": {
            "value": round(update_seconds(ours), 2), "baseline": round(update_seconds(trl), 2),
            "ratio": round(update_seconds(trl) / update_seconds(ours), 2),
            "unit": f"wall seconds per GRPO update of {JOB['prompts_per_step']} x {JOB['n']} "
                    f"rollouts ({task}); ratio = TRL's over ours",
            "baseline_name": "TRL GRPOTrainer, same task and job, alternating runs",
            "goal": None,
        },
    }
    return write_result(NAME, figures, merge=True)


# ------------------------------------------------------------------------------ the task


def environment(task: str, steps: int):
    """The task's rows (enough for ``steps``), held-out rows and reward."""
    from agentrl_sdk.environments.reasoning_gym import reasoning_gym

    size = steps * JOB["prompts_per_step"] * 3  # extra: held-out questions are removed
    return reasoning_gym(task, size=size, seed=1, eval_size=JOB["eval_rows"], eval_seed=EVAL_SEED,
                         config=TASKS.get(task))


def starting_model(task: str) -> Path:
    """SmolLM2-135M-Instruct warm-started on the task's own generated examples (cached):
    zero-shot it never writes the ``<answer>`` tag the verifier reads."""
    from examples.reasoning_gym.model import warm_started

    return warm_started(task, TASKS.get(task), held_out=(EVAL_SEED, JOB["eval_rows"]),
                        progress=False)


def _eval_config(model: str | Path) -> dict[str, Any]:
    return {
        "model": {"path": str(model)},
        "engine": {"options": {"dtype": "prefer-bfloat16", "max_batch_size": 48}},
        "rollout": {"concurrency": 48,
                    "sampling": {"temperature": 1.0, "max_tokens": JOB["max_tokens"], "seed": 0}},
        "tracking": {"enabled": False},
    }


def evaluate(env: Any, model: str | Path) -> tuple[float, float]:
    """Greedy held-out pass@1 (%) of ``model`` and its generated tokens."""
    import agentrl_sdk as sdk

    result = sdk.evaluate(env.graph, env.eval_rows, env.reward, _eval_config(model))
    return round(100 * result.metrics["pass_at_1"], 1), result.metrics.get("tokens/generated", 0)


def train_ours(env: Any, base: Path, steps: int, out: Path) -> dict[str, Any]:
    """Our GRPO run; returns the final model, minutes and generated tokens."""
    import agentrl_sdk as sdk

    config = {
        "model": {"path": str(base)},
        "engine": {"options": {"dtype": "prefer-bfloat16", "prefix_cache_mb": 256,
                               "max_batch_size": 48}},
        "rollout": {"n": JOB["n"], "concurrency": 48,
                    "sampling": {"temperature": 1.0, "max_tokens": JOB["max_tokens"], "seed": 0}},
        "algorithm": {"advantage_estimator": "grpo", "clip_low": JOB["clip_low"],
                      "clip_high": JOB["clip_high"], "agg": "seq-mean-token-mean"},
        "trainer": {"placement": "in_process", "world_size": 1, "num_cpus_per_worker": 2,
                    "dtype": "prefer-bfloat16", "trainable_layers": TRAINABLE_LAYERS,
                    "lr": JOB["lr"], "weight_decay": 0.0, "max_grad_norm": 1.0,
                    "temperature": 1.0, "share_prefix": True},
        "data": {"batch_size": JOB["prompts_per_step"], "shuffle": False},
        "max_steps": steps,
        "evaluation": {"every": 0},
        "checkpoint": {"dir": str(out), "export_final": True},
        "tracking": {"enabled": False},
    }
    start = time.perf_counter()
    result = sdk.train(env.graph, env.rows, env.reward, config)
    minutes = (time.perf_counter() - start) / 60
    return {"model": result.final_model, "minutes": round(minutes, 2),
            "generated_tokens": int(sum(m.get("tokens/generated", 0) for m in result.history)),
            "reward": [round(m["reward/mean"], 3) for m in result.history]}


def train_trl(env: Any, base: Path, steps: int, out: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same job; returns its saved model, minutes, generated tokens."""
    import torch
    from datasets import Dataset
    from langchain_core.messages import AIMessage
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = env.rows
    generated: list[float] = []

    def reward(completions: list[list[dict[str, str]]], idx: list[int], **_: Any) -> list[float]:
        values = []
        for completion, i in zip(completions, idx, strict=True):
            state = {"messages": [AIMessage(completion[-1]["content"])]}
            values.append(sum(env.reward(state, rows[i], None).values()))
        return values

    class CountingTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            generated.append(float(output["completion_mask"].sum()))
            return output

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True,
                                                 dtype=torch.float32)
    model.requires_grad_(False)  # the same trained layers as ours
    for layer in model.model.layers[-TRAINABLE_LAYERS:]:
        layer.requires_grad_(True)
    model.model.norm.requires_grad_(True)
    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=JOB["prompts_per_step"] * JOB["n"],
        gradient_accumulation_steps=1, num_generations=JOB["n"],
        max_completion_length=JOB["max_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=JOB["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=JOB["clip_low"],
        epsilon_high=JOB["clip_high"], loss_type="grpo", scale_rewards="group",
        num_iterations=1, gradient_checkpointing=False, bf16=False, use_cpu=True,
        shuffle_dataset=False, max_steps=steps, seed=0, logging_steps=1, report_to="none",
        save_strategy="no",
    )
    data = Dataset.from_list([{"prompt": r["messages"], "idx": i} for i, r in enumerate(rows)])
    trainer = CountingTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=tokenizer)
    trainer.train()
    folder = out / "trl-final"
    trainer.save_model(str(folder))
    tokenizer.save_pretrained(folder)
    minutes = (time.perf_counter() - start) / 60
    history = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"model": str(folder), "minutes": round(minutes, 2),
            "generated_tokens": int(sum(generated)), "reward": [round(r, 3) for r in history]}


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="leg_counting")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--trl", action="store_true", help="also TRL, on the first task")
    parser.add_argument("--rounds", type=int, default=1, help="alternating TRL/ours rounds")
    parser.add_argument("--trl-steps", type=int, default=None,
                        help="TRL's updates (default --steps); fewer give it a similar wall time, "
                        "as its gain per minute is what is compared")
    parser.add_argument("--probe", default=None,
                        help="only the starting (warm-started) held-out pass@1 of these tasks")
    args = parser.parse_args()

    from rich.console import Console

    console = Console()
    if args.probe:
        found = dict(_load().get("details", {}).get("starting_pass_at_1", {}))
        for task in args.probe.split(","):
            start = time.perf_counter()
            base = starting_model(task)
            built = time.perf_counter() - start
            found[task] = evaluate(environment(task, 1), base)[0]
            console.print(f"{task}: held-out pass@1 {found[task]}% (warm start {built:.0f} s)")
        write_result(NAME, {"starting_pass_at_1": found}, merge=True)  # kept under details
        return
    tasks = args.tasks.split(",")
    with tempfile.TemporaryDirectory(prefix="environments-") as tmp:
        for number, task in enumerate(tasks):
            env, base = environment(task, args.steps), starting_model(task)
            before, _ = evaluate(env, base)
            console.print(f"[bold]{task}[/]: held-out pass@1 before {before}%")
            sides = {"ours": [], "trl": []}
            rounds = args.rounds if args.trl and number == 0 else 1
            for r in range(rounds):
                order = ("ours", "trl") if args.trl and number == 0 else ("ours",)
                for side in order:
                    train = train_trl if side == "trl" else train_ours
                    steps = (args.trl_steps or args.steps) if side == "trl" else args.steps
                    run = train(env, base, steps, Path(tmp) / f"{task}-{side}{r}")
                    after, _ = evaluate(env, run.pop("model"))
                    entry = {"heldout_before": before, "heldout_after": after, **run,
                             "steps": steps, "rollouts_per_step":
                             JOB["prompts_per_step"] * JOB["n"], "unit": "held-out pass@1 (%)",
                             "heldout_rows": len(env.eval_rows)}
                    console.print(f"  {side} round {r}: {before}% -> {after}% in "
                                  f"{run['minutes']} min ({run['generated_tokens']} tokens)")
                    sides[side].append(entry)
                    if side == "ours":  # kept at once: a later run may not finish in time
                        record("tasks", task, entry | {"rounds": len(sides["ours"])})
            if sides["trl"]:
                record_vs_trl(task, _pooled(sides["ours"]), _pooled(sides["trl"]), rounds)
    console.print(f"wrote {RESULTS_DIR / f'{NAME}.json'}")


def _pooled(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one side as one entry: mean after and minutes, summed tokens."""
    n = len(entries)
    return {"heldout_before": entries[0]["heldout_before"],
            "heldout_after": round(sum(e["heldout_after"] for e in entries) / n, 1),
            "minutes": round(sum(e["minutes"] for e in entries) / n, 2),
            "generated_tokens": int(sum(e["generated_tokens"] for e in entries) / n),
            "steps": entries[0]["steps"],
            "rounds": [{k: e[k] for k in ("heldout_after", "minutes", "generated_tokens")}
                       for e in entries]}


if __name__ == "__main__":
    main()
