"""Tree rollouts against chain GRPO on the real-model demo, at the same leaves per group.

    python benchmarks/tree.py [--steps 16] [--rounds 1] [--branches 4] [--depth 1]
                              [--min-entropy NATS] [--config examples/two_step/config.yaml]

Alternates runs of the shipped word-problems recipe (`examples/word_problems`: n rollouts of
each problem from the start, GRPO) and the same recipe with ``rollout.tree`` (n / branches**depth
roots, each forked into ``branches`` continuations after the calculator's result; with
``--min-entropy``, only where the answer call after it is that unsure, else new roots) and
``algorithm.advantage_estimator: tree`` (Tree-GRPO), on a quiet machine, seed 0 each.

``--config`` runs another task's recipe (its ``rollout.tree`` settings kept, turned on):
``examples/two_step/config.yaml`` (two calculator calls, the second the unsure one) writes
``tree_two_step.json``; ``examples/three_step/config.yaml`` (three, the last the unsure one;
branching after the second result) ``tree_three_step.json``.

Figures (``benchmarks/results/tree.json``), tree over chain (medians over rounds):

- ``generated_tokens``: tokens the engine generated per update (goal <= 0.6);
- ``rollout_s`` and ``train_s``: the stages' medians per update (``train_s``: of the updates
  that trained; ``updates_without_signal`` counts the others);
- ``gain_per_minute``: held-out greedy points gained per minute of RL (goal >= 1.3);
- ``heldout_gain``: the median run's held-out gain, tree minus chain (the other goal: the same
  gain with <= 0.6 of the tokens);
- with each arm's held-out curve (accuracy by update and the minute it was measured).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import write_result  # noqa: E402
from real_model import CONFIG, _series, measure  # noqa: E402
from rich.console import Console  # noqa: E402


def arm(config: Any, tree: dict | None) -> Any:
    """``config`` as the chain arm (``tree`` None) or with tree rollouts ``tree``."""
    config = config.model_copy(deep=True)
    if tree is not None:  # on top of the recipe's own tree settings (e.g. skip_first)
        config.rollout.tree = type(config.rollout.tree).model_validate(
            {**config.rollout.tree.model_dump(), "enabled": True, **tree})
        config.algorithm.advantage_estimator = "tree"
    return config


def figures_of(run_id: str, uri: str) -> dict[str, Any]:
    """One run's figures: real_model's, plus generated tokens and evaluation minutes."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    measured = measure(run_id, uri)
    evals = _series(client, run_id, "eval/reward/mean")
    gain, minutes = measured["heldout_gain"], measured["rl_minutes"]
    # An update with no group with signal trains nothing (0 s): not an update time.
    train_s = [v for _, v, _ in _series(client, run_id, "time/train_s")]
    return {
        "run_id": run_id,
        "generated_tokens": statistics.median(
            v for _, v, _ in _series(client, run_id, "tokens/generated")),
        **minutes["stage_medians_s"],
        "train_s": statistics.median([v for v in train_s if v > 0] or [0.0]),
        "updates_without_signal": sum(v == 0 for v in train_s),
        "heldout_gain": gain["value"], "heldout_before": gain["baseline"],
        "rl_minutes": minutes["value"],
        "gain_per_minute": gain["value"] / minutes["value"] if minutes["value"] else None,
        "heldout_curve": [
            {"update": int(s), "accuracy": round(100 * v, 1),
             "minute": round((t - evals[0][2]) / 60_000, 1)} for s, v, t in evals],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="updates per run")
    parser.add_argument("--rounds", type=int, default=1, help="alternating chain/tree rounds")
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--min-entropy", type=float, default=None,
                        help="rollout.tree.min_entropy: branch only before calls this unsure")
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="the task's recipe (default: the word-problems demo)")
    args = parser.parse_args()
    from agentrl_sdk.pipeline import TrainConfig
    from examples._train import run

    base = TrainConfig.from_yaml(args.config)
    base.max_steps = args.steps
    Path("runs").mkdir(exist_ok=True)
    console = Console()
    tree = {"branches": args.branches, "depth": args.depth, "min_entropy": args.min_entropy}
    runs: dict[str, list[dict[str, Any]]] = {"chain": [], "tree": []}
    for round_ in range(args.rounds):
        for name, shape in (("chain", None), ("tree", tree)):
            result = run(arm(base, shape))
            runs[name].append(figures_of(result.run_id, base.tracking.uri))
            console.print(f"round {round_ + 1} {name}: {runs[name][-1]}")

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name] if r[key] is not None)

    def ratio(key: str, goal: float | None, unit: str) -> dict[str, Any]:
        chain, tree_ = median("chain", key), median("tree", key)
        return {"value": round(tree_ / chain, 3) if chain else None, "baseline": chain,
                "after": tree_, "goal": goal, "unit": unit}  # fmt: skip

    figures = {
        "generated_tokens": ratio("generated_tokens", 0.6, "tokens generated per update, "
                                  "tree / chain (median update, median round)"),
        "rollout_s": ratio("rollout_s", None, "rollout seconds per update, tree / chain"),
        "train_s": ratio("train_s", None, "update seconds (updates that trained), tree / chain"),
        "gain_per_minute": ratio("gain_per_minute", 1.3, "held-out points gained per minute "
                                 "of RL, tree / chain"),
        "heldout_gain": {"value": round(median("tree", "heldout_gain")
                                        - median("chain", "heldout_gain"), 1),
                         "baseline": median("chain", "heldout_gain"),
                         "after": median("tree", "heldout_gain"), "goal": None,
                         "unit": f"held-out greedy points gained in {args.steps} updates, "
                                 "median run: tree minus chain"},
        "runs": {"value": None, "baseline": None, "ratio": None, "goal": None,
                 "unit": "every run's figures", "tree": tree, "steps": args.steps, **runs},
    }  # fmt: skip
    console.print({k: v["value"] for k, v in figures.items()})
    # The demo's recipe writes tree.json; another task's (or recipe's) tree_<its folder>.json.
    config = args.config.resolve()
    name = "tree" if config == CONFIG else f"tree_{config.parent.name}"
    console.print(f"wrote {write_result(name, figures)}")


if __name__ == "__main__":
    main()
