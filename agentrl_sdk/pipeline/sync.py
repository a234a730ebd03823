"""The synchronous pipeline: rollouts -> rewards -> advantages -> update -> weight sync, repeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.data import LoaderPosition, RowLoader
from agentrl_sdk.engines import Engine, create_engine
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.rollout import arollout_batch, default_input, row_id_of
from agentrl_sdk.rollout.rewards import RewardFn, score
from agentrl_sdk.rollout.samples import build_samples
from agentrl_sdk.tracing import TrainingRun, rollout_credit
from agentrl_sdk.trainer import TrainerGroup, WeightSync
from agentrl_sdk.types import Batch, Sample, Trajectory

TRAINED_POLICY = "default"


class TrainResult(BaseModel):
    """What a training job leaves behind."""

    steps: int
    history: list[dict[str, float]] = Field(default_factory=list)
    run_id: str | None = None
    final_model: str | None = None
    checkpoint: str | None = None


@dataclass
class _Job:
    """Everything one training job's steps share."""

    graph: Any
    reward_fn: RewardFn | None
    input_fn: Callable[[dict[str, Any]], Any]
    config: TrainConfig
    tokenizer: Any
    loader: RowLoader
    engine: Engine
    group: TrainerGroup
    weight_sync: WeightSync
    run: TrainingRun | None = None


async def run_sync(
    graph: Any,
    rows: list[dict[str, Any]],
    reward_fn: RewardFn | None,
    config: TrainConfig,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    console: Console | None = None,
) -> TrainResult:
    """Train ``config.max_steps`` policy updates of ``graph`` on ``rows``."""
    from transformers import AutoTokenizer

    console = console or Console()
    path = _model_path(config)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    loader = RowLoader(rows, config.data.batch_size, shuffle=config.data.shuffle, seed=config.data.seed)
    engine = create_engine(config.engine.backend, path, max_batch_size=config.engine.max_batch_size)
    try:
        group = await asyncio.to_thread(TrainerGroup, path, config.trainer, config.algorithm)
    except BaseException:
        engine.close()
        raise
    run = _start_run(config)
    job = _Job(graph, reward_fn, input_fn, config, tokenizer, loader, engine, group, WeightSync(),
               run)
    result = TrainResult(steps=0, run_id=run.run_id if run else None)
    status = "FAILED"
    try:
        start = await _maybe_resume(job, console)
        with _progress(console) as progress:
            task = progress.add_task("train", total=config.max_steps, completed=start, reward=0.0)
            for step in range(start, config.max_steps):
                metrics = await _step(job, step)
                result.history.append(metrics)
                result.steps = step + 1
                if run:
                    run.log_metrics(step, metrics)
                progress.update(task, advance=1, reward=metrics["reward/mean"])
                console.log(_step_line(step, metrics))
                every = config.checkpoint.every
                if config.checkpoint.dir and every and (step + 1) % every == 0:
                    result.checkpoint = await _save(job, step + 1)
        result = await _finish(job, result, run)
        status = "FINISHED"
        return result
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "KILLED"
        raise
    finally:
        if run:
            run.end(status)
        engine.close()
        await asyncio.to_thread(group.shutdown)


async def _step(job: _Job, step: int) -> dict[str, float]:
    """One policy update: rollouts, rewards, advantages, update, weight sync."""
    config = job.config
    batch_rows = job.loader.next_batch()
    traced = job.run is not None and config.tracking.traces != "off"
    started = time.perf_counter()
    trajectories = await arollout_batch(
        job.graph, batch_rows, job.engine, tokenizer=job.tokenizer,
        config=_rollout_config(config, step), input_fn=job.input_fn, record_events=traced,
    )
    rollout_s = time.perf_counter() - started
    counts = await score(
        trajectories,
        {row_id_of(r): r for r in batch_rows},
        job.reward_fn,
        on_error=config.reward.on_error,
        failed_rollout_reward=config.reward.failed_rollout_reward,
    )
    samples, sample_metrics = build_samples(
        trajectories, estimator=config.algorithm.advantage_estimator, policies=[TRAINED_POLICY]
    )
    metrics = {**rollout_metrics(trajectories, rollout_s), **sample_metrics}
    metrics.update({f"count/{k}": float(v) for k, v in counts.items()})
    if traced and job.run is not None:
        metrics.update(_log_traces(job, job.run, step, trajectories, samples))
    started = time.perf_counter()
    if samples:
        update = await asyncio.to_thread(job.group.update, Batch(step=step, samples=samples))
        metrics.update({f"train/{k}": v for k, v in update.items()})
    metrics["time/train_s"] = time.perf_counter() - started
    started = time.perf_counter()
    versions = await job.weight_sync.push(job.group, [job.engine])
    metrics["time/weight_sync_s"] = time.perf_counter() - started
    metrics["policy_version"] = float(versions[0])
    return metrics


def _log_traces(
    job: _Job, run: TrainingRun, step: int, trajectories: list[Trajectory], samples: list[Sample]
) -> dict[str, float]:
    """Trace the step's sampled rollouts: built here, written on the run's writer thread while
    the trainer updates (the trainer runs in its own processes)."""
    started = time.perf_counter()
    tracking = job.config.tracking
    ids = run.log_traces(
        step, trajectories, sampling=tracking.traces, k=tracking.traces_k,
        credit=rollout_credit(samples, job.config.algorithm.agg), tokenizer=job.tokenizer,
        background=True,
    )
    return {"traces/logged": float(len(ids)), "traces/write_errors": float(run.trace_write_errors),
            "time/traces_build_s": time.perf_counter() - started}


def _rollout_config(config: TrainConfig, step: int) -> RolloutConfig:
    """The step's rollout config: a seeded run draws new samples each step, and a resumed
    run draws exactly the samples the uninterrupted run would have."""
    sampling = config.rollout.sampling
    if sampling.seed is None:
        return config.rollout
    seeded = sampling.model_copy(update={"seed": sampling.seed + step})
    return config.rollout.model_copy(update={"sampling": seeded})


def _model_path(config: TrainConfig) -> str:
    if not config.model.path or not Path(config.model.path).is_dir():
        raise ValueError(
            f"model.path must be a local save_pretrained folder, got {config.model.path!r} "
            "(build one with `agentrl build-model OUT` or agentrl_sdk.models)"
        )
    return config.model.path


def _start_run(config: TrainConfig) -> TrainingRun | None:
    if not config.tracking.enabled:
        return None
    run = TrainingRun(config.tracking.uri, config.tracking.experiment, config.tracking.run_name)
    run.log_config(config.model_dump(mode="json"))
    return run


async def _maybe_resume(job: _Job, console: Console) -> int:
    """The step to start from: 0, or the newest checkpoint's (weights pushed to the engine)."""
    checkpoint = job.config.checkpoint
    if not checkpoint.resume:
        return 0
    latest = _latest_checkpoint(Path(checkpoint.dir))
    if latest is None:
        console.log(f"no checkpoint in {checkpoint.dir}: starting from step 0")
        return 0
    extra = await asyncio.to_thread(job.group.load_checkpoint, latest)
    job.loader.position = LoaderPosition.model_validate(extra["data_position"])
    await job.weight_sync.push(job.group, [job.engine])
    console.log(f"resumed from {latest} at step {extra['step']}")
    return int(extra["step"])


def _latest_checkpoint(directory: Path) -> Path | None:
    steps = sorted(directory.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return steps[-1] if steps else None


async def _save(job: _Job, step: int) -> str:
    path = Path(job.config.checkpoint.dir) / f"step_{step}"
    extra = {"step": step, "data_position": job.loader.position.model_dump()}
    await asyncio.to_thread(job.group.save_checkpoint, path, extra)
    if job.run and job.config.tracking.log_checkpoints:
        await asyncio.to_thread(job.run.log_artifacts, path, f"checkpoints/{path.name}")
    return str(path)


async def _finish(job: _Job, result: TrainResult, run: TrainingRun | None) -> TrainResult:
    """Checkpoint the last step (if not yet) and export the final policy."""
    checkpoint = job.config.checkpoint
    if checkpoint.dir:
        if result.checkpoint is None or not result.checkpoint.endswith(f"step_{result.steps}"):
            result.checkpoint = await _save(job, result.steps)
        if checkpoint.export_final:
            final = Path(checkpoint.dir) / "final_model"
            await asyncio.to_thread(job.group.export_pretrained, final)
            result.final_model = str(final)
            if run:
                run.log_artifacts(final, "final_model")
    return result


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn(),
        console=console, transient=True,
    )


def _step_line(step: int, m: dict[str, float]) -> str:
    return (
        f"step {step + 1}: reward {m['reward/mean']:.3f} ± {m['reward/std']:.3f} · "
        f"loss {m.get('train/loss', float('nan')):.4f} · "
        f"{m['tokens/generated_per_s']:.0f} tok/s · rollout {m['time/rollout_s']:.1f}s · "
        f"train {m['time/train_s']:.1f}s · sync {m['time/weight_sync_s']:.2f}s"
    )
