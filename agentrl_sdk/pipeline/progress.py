"""A job's progress: the progress bar, the step's record (history, MLflow, terminal line)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl_sdk.pipeline.results import TrainResult

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.job import Job

__all__ = ["log_console", "step_line", "step_log"]


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
