"""Exactly-once under crashes: a fully-async run SIGKILLed at 100 random moments, resumed each time.

    python benchmarks/crash_resume.py [--kills N] [--quick] [--seed S] [--finish FOLDER]

The tool-selection demo's fully-async job (tiny policy, max_staleness 1 with stale groups
rolled out again, partial rollouts across weight pushes, `checkpoint.every: 1`, the last two
kept, MLflow on sqlite) on 24 of its rows (an epoch every 8 updates), as runs of `STEPS`
updates. Each life of the driver dies where a seeded generator says: inside its n-th engine
call (mid-rollout), update (mid-update), weight push (mid-push; the first one of a resumed
life is the resume's), checkpoint (while the trainer writes its state, before the pipeline
state, before the manifest, or right after it), each at a random delay into the operation
(its end when the operation is quicker: counted as ``KIND_end``), or SIGKILLed with its
whole session by this process at a random time (``random:startup`` when it had not updated
yet). It is started again with ``checkpoint.resume: true`` until a life finishes the run;
runs follow one another until the kills are done. The drivers connect to one standing Ray
cluster (`trainer.ray_address`): a killed driver's trainer actor dies with it, the cluster
lives on, and a life does not pay for starting Ray (`tests/faults/test_driver_kill.py` kills
a driver that started its own). The next life's driver imports while the current one runs.

Checks (`tests/faults/_crash_ledger.py`), per run, summed:
- `skipped`: updates 1..N the final checkpoint's weights do not descend from. Each update
  logs digests of the weights before and after it; the walk back from the final weights must
  meet one update per step, N down to 1, and end at the base model. `duplicated` counts an
  update met at a step not its own, too.
- `duplicated`: rows trained twice within an epoch by the updates of that chain (or trained
  and still held by the final checkpoint's queue); `lost`: rows drawn from the loader that
  were neither trained by the chain nor held by the final checkpoint's queue or pending rows.
- `steps_logged_twice`: steps with any metric logged twice in the run's MLflow history
  (`steps_not_logged`: steps without `reward/mean`); each run must be one run, FINISHED.
- `checkpoint_s_per_update`: the median wall time of a checkpoint save against the median
  update step without it, from the same lives.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from benchmarks._results import write_result  # noqa: E402
from tests.faults._crash_runs import RayCluster, crash_run, finish_run  # noqa: E402

STEPS = 40  # updates per run (5 epochs of the 24 rows)
QUICK_KILLS, QUICK_STEPS = 10, 12

SUMMED = ("lives", "kills", "skipped", "duplicated", "lost", "trained_groups", "held_groups",
          "drawn_rows", "dropped_stale", "retried_stale", "updates_applied", "updates_redone",
          "resumes", "runs", "steps_logged_twice", "steps_not_logged", "partial_rollouts",
          "epochs")  # fmt: skip


def bench(kills: int, steps: int, seed: int, console: Console, folder: Path | None) -> dict:
    """Runs of ``steps`` updates, killed ``kills`` times in all; their counts summed. With
    ``folder``, the runs a stopped benchmark left there are finished and counted first (their
    lives read from their ledgers, the unfinished one resumed once more)."""
    rng = random.Random(seed)
    earlier = sorted(folder.glob("run_*"), key=lambda p: int(p.name[4:])) if folder else []
    folder = folder or Path(tempfile.mkdtemp(prefix="crash_resume_"))
    cluster = RayCluster(folder)
    runs = []
    started = time.perf_counter()
    try:
        for path in earlier:
            config = json.loads((path / "config.json").read_text())
            config["trainer"]["ray_address"] = cluster.address
            (path / "config.json").write_text(json.dumps(config))
            runs.append(finish_run(path, steps))
            console.log(f"run {len(runs)} (finished now): {runs[-1].kills} kills")
        while sum(r.kills for r in runs) < kills:
            left = kills - sum(r.kills for r in runs)
            run = crash_run(folder / f"run_{len(runs)}", steps, kills=left, rng=rng,
                            ray_address=cluster.address)  # fmt: skip
            runs.append(run)
            shown = {k: run.counts[k] for k in ("skipped", "duplicated", "lost",
                                                 "steps_logged_twice", "kills_by_kind")}
            console.log(f"run {len(runs)}: {run.kills} kills in {len(run.lives)} lives; "
                        f"{json.dumps(shown)}")
    finally:
        cluster.stop()
    total = {key: sum(r.counts[key] for r in runs) for key in SUMMED}
    kinds: Counter[str] = Counter()
    for run in runs:
        kinds.update(run.counts["kills_by_kind"])
    saves = [r.counts["checkpoint_s"] for r in runs if r.counts["checkpoint_s"] is not None]
    steps_s = [r.counts["step_without_checkpoint_s"] for r in runs
               if r.counts["step_without_checkpoint_s"] is not None]  # fmt: skip
    return {
        **total, "rounds": len(runs), "steps": steps * len(runs), "kills_by_kind": dict(kinds),
        "statuses": Counter(r.counts["status"] for r in runs),
        "problems": [p for r in runs for p in r.counts["problems"]],
        "failed_lives": [f for r in runs for f in r.counts["failed_lives"]],
        "checkpoint_s": _median(saves), "step_without_checkpoint_s": _median(steps_s),
        "checkpoints": sum(r.counts["checkpoints"] for r in runs),
        "life_s": _median([life["seconds"] for r in runs for life in r.lives
                           if life["seconds"] is not None]),
        "wall_s": time.perf_counter() - started, "folder": str(folder),
    }


def _median(values: list[float]) -> float | None:
    """The median of per-run medians (weighting runs alike)."""
    values = sorted(values)
    return values[len(values) // 2] if values else None


def main(kills: int, steps: int, seed: int, folder: Path | None = None) -> None:
    console = Console()
    out = bench(kills, steps, seed, console, folder)
    console.print({k: v for k, v in out.items()})
    context = {k: out[k] for k in ("rounds", "steps", "lives", "kills_by_kind", "resumes",
                                   "updates_applied", "updates_redone", "partial_rollouts",
                                   "epochs", "statuses", "problems", "failed_lives")}
    context["seed"] = seed
    context["wall_s"] = round(out["wall_s"])

    def count(value: int, baseline: int, unit: str, **extra) -> dict:
        return {"value": value, "baseline": baseline,
                "ratio": round(value / baseline, 4) if baseline else None, "goal": 0,
                "unit": unit, **extra}

    ckpt, step = out["checkpoint_s"], out["step_without_checkpoint_s"]
    write_result("crash_resume", {
        "kills": {"value": out["kills"], "baseline": None, "ratio": None, "goal": 100,
                  "unit": "driver SIGKILLs, each followed by a resume", **context,
                  "median_life_s": out["life_s"]},
        "skipped": count(out["skipped"], out["steps"], "updates the final weights do not "
                         "descend from (of every run's steps)"),
        "duplicated": count(out["duplicated"], out["trained_groups"], "rows (groups) trained "
                            "twice within an epoch, or trained and still queued; updates "
                            "applied twice (of the groups trained)"),
        "lost": count(out["lost"], out["drawn_rows"], "rows drawn but neither trained nor "
                      "held by the final checkpoint (of the rows drawn)",
                      held_at_end=out["held_groups"], dropped_stale=out["dropped_stale"],
                      retried_stale=out["retried_stale"]),
        "steps_logged_twice": count(out["steps_logged_twice"], out["steps"], "MLflow steps "
                                    "with a metric logged twice (of every run's steps)",
                                    steps_not_logged=out["steps_not_logged"], runs=out["runs"]),
        "checkpoint_s_per_update": {
            "value": round(ckpt, 3), "baseline": round(step, 3), "ratio": round(ckpt / step, 3),
            "goal": None, "checkpoints": out["checkpoints"],
            "unit": "s of wall time per update spent checkpointing (checkpoint.every: 1: "
                    "trainer state, pipeline state, manifest), median; baseline: the median "
                    "update step without it; shared 2-core CPU, noisy",
        },
    })


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs in all (default 100)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_KILLS} kills in runs of {QUICK_STEPS} updates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--finish", type=Path, default=None, metavar="FOLDER",
                        help="the folder of a benchmark that stopped: finish its runs and count "
                             "them (then kill more if fewer than --kills)")
    args = parser.parse_args()
    main(QUICK_KILLS if args.quick else args.kills, QUICK_STEPS if args.quick else STEPS,
         args.seed, args.finish)
