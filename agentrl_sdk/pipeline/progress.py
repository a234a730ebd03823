"""A job's progress: the progress bar and each step's record (history, MLflow, line, traces)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl_sdk.algorithms import LossAgg
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.tracing import TrainingRun, rollout_credit
from agentrl_sdk.tracing.config import TrackingConfig
from agentrl_sdk.types import Sample, Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.job import Job

__all__ = ["log_console", "step_line", "step_log", "trace_step"]


def log_console() -> Console:
    """The console a job logs its lines to when the caller gives none: rich's time column
    without its source column (``progress.py:45`` would name the SDK's line, not the user's)."""
    return Console(log_path=False)


@contextlib.contextmanager
def step_log(
    job: Job, result: TrainResult, console: Console, start: int
) -> Iterator[Callable[[int, dict[str, float]], bool]]:
    """A progress bar for the job's steps, and ``record(step, metrics)`` that files a finished
    step (history, MLflow metrics, progress, terminal line) and says whether a checkpoint of
    it is due (``checkpoint.every``)."""
    config = job.config
    progress = Progress(
        TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn(),
        console=console, transient=True,
    )  # fmt: skip
    with progress:
        task = progress.add_task("train", total=config.max_steps, completed=start, reward=0.0)

        def record(step: int, metrics: dict[str, float]) -> bool:
            for policy in job.policies.values():
                metrics.update(policy.engine_metrics())
            result.history.append(metrics)
            result.steps = step + 1
            if job.run:
                metrics.update(job.run.health())
                job.run.log_metrics(step, metrics)
            progress.update(task, advance=1, reward=metrics["reward/mean"])
            console.log(step_line(step, metrics))
            every = config.checkpoint.every
            return bool(config.checkpoint.dir and every and (step + 1) % every == 0)

        yield record


def step_line(step: int, m: dict[str, float]) -> str:
    """One step's summary line on the terminal."""
    nan = float("nan")
    if m.get("train/skipped_no_signal") == 1.0:
        update = "no update (no signal)"
    else:
        update = f"loss {m.get('train/loss', nan):.4f}"
    # What decides whether GRPO can learn: groups whose rewards all agree give no gradient;
    # with a critic (PPO), how well it predicts.
    if "critic/value_loss" in m:
        learning = (f"value loss {m['critic/value_loss']:.4f} · explained var "
                    f"{m.get('critic/explained_variance', nan):.2f}")
    else:
        learning = f"flat groups {m.get('adv_zero_std_group_frac', nan):.0%}"
    return (
        f"step {step + 1}: reward {m['reward/mean']:.3f} ± {m['reward/std']:.3f} · {update} · "
        f"{m['tokens/generated_per_s']:.0f} tok/s · rollout {m['time/rollout_s']:.1f}s · "
        f"train {m['time/train_s']:.1f}s · sync {m['time/weight_sync_s']:.2f}s"
        f" · entropy {m.get('train/entropy', nan):.3f} · {learning}"
    )


def trace_step(
    run: TrainingRun | None,
    tracking: TrackingConfig,
    step: int,
    trajectories: list[Trajectory],
    samples: list[Sample],
    *,
    agg: LossAgg,
    tokenizer: Any,
) -> dict[str, float]:
    """Trace the step's sampled rollouts when tracing is on (else nothing): built here, written
    by the run's writer process while the trainer updates and the next rollouts run (off this
    process's GIL). ``agg`` is the loss aggregation each rollout's share is computed with.
    Returns the ``traces/...`` metrics."""
    if run is None or tracking.traces == "off":
        return {}
    started = time.perf_counter()
    ids = run.log_traces(
        step, trajectories, sampling=tracking.traces, k=tracking.traces_k,
        credit=rollout_credit(samples, agg), tokenizer=tokenizer, background=True,
    )
    return {"traces/logged": float(len(ids)), "traces/write_errors": float(run.trace_write_errors),
            "traces/lost": float(run.traces_lost),
            "time/traces_build_s": time.perf_counter() - started}
