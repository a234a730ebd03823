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
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.pipeline.policies import (
    DEFAULT_POLICY,
    Policy,
    model_path,
    start_policies,
    stop_policies,
)
from agentrl_sdk.rollout import arollout_batch, default_input, row_id_of
from agentrl_sdk.rollout.rewards import RewardFn, score
from agentrl_sdk.rollout.samples import build_samples
from agentrl_sdk.tracing import TrainingRun, rollout_credit
from agentrl_sdk.types import Batch, Sample, Trajectory


class TrainResult(BaseModel):
    """What a training job leaves behind."""

    steps: int
    history: list[dict[str, float]] = Field(default_factory=list)
    run_id: str | None = None
    final_model: str | None = None
    final_models: dict[str, str] = Field(default_factory=dict)  # other trained policies
    checkpoint: str | None = None
    skipped_rows: int = 0


@dataclass
class _Job:
    """Everything one training job's steps share."""

    graph: Any
    reward_fn: RewardFn | None
    input_fn: Callable[[dict[str, Any]], Any]
    config: TrainConfig
    tokenizer: Any
    loader: RowLoader
    policies: dict[str, Policy]
    run: TrainingRun | None = None

    @property
    def trained(self) -> list[Policy]:
        return [p for p in self.policies.values() if p.group is not None]

    @property
    def engines(self) -> Any:
        """What rollouts call: the gate of the one policy, or every policy's gate by name."""
        gates = {name: p.gate for name, p in self.policies.items()}
        return gates[DEFAULT_POLICY] if len(gates) == 1 else gates


@dataclass
class _Rollouts:
    """One step's rollouts in flight, and the loader position from before its rows."""

    step: int
    rows: list[dict[str, Any]]
    position: LoaderPosition
    task: asyncio.Future[list[Trajectory]]
    started: float


async def run_sync(
    graph: Any,
    rows: list[dict[str, Any]],
    reward_fn: RewardFn | None,
    config: TrainConfig,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    console: Console | None = None,
    skipped_rows: int = 0,
) -> TrainResult:
    """Train ``config.max_steps`` policy updates of ``graph`` on ``rows``.

    ``skipped_rows`` (dataset rows that failed validation) is reported and logged.
    """
    from transformers import AutoTokenizer

    console = console or Console()
    tokenizer = AutoTokenizer.from_pretrained(model_path(config.model), local_files_only=True)
    loader = RowLoader(rows, config.data.batch_size, shuffle=config.data.shuffle, seed=config.data.seed)
    policies = await start_policies(config)
    run = _start_run(config)
    job = _Job(graph, reward_fn, input_fn, config, tokenizer, loader, policies, run)
    result = TrainResult(steps=0, run_id=run.run_id if run else None, skipped_rows=skipped_rows)
    if skipped_rows:
        console.log(f"[yellow]{skipped_rows} dataset rows failed validation and are left out")
        if run:
            run.log_metrics(0, {"data/skipped_rows": float(skipped_rows)})
    status = "FAILED"
    pending: _Rollouts | None = None
    try:
        start = await _maybe_resume(job, console)
        with _progress(console) as progress:
            task = progress.add_task("train", total=config.max_steps, completed=start, reward=0.0)
            for step in range(start, config.max_steps):
                current = pending or _start_rollouts(job, step)
                pending = None
                prefetch = config.prefetch_rollouts and step + 1 < config.max_steps
                metrics, pending = await _step(job, current, prefetch=prefetch)
                result.history.append(metrics)
                result.steps = step + 1
                if run:
                    run.log_metrics(step, metrics)
                progress.update(task, advance=1, reward=metrics["reward/mean"])
                console.log(_step_line(step, metrics))
                every = config.checkpoint.every
                if config.checkpoint.dir and every and (step + 1) % every == 0:
                    position = pending.position if pending else job.loader.position
                    result.checkpoint = await _save(job, step + 1, position)
        result = await _finish(job, result, run)
        status = "FINISHED"
        return result
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "KILLED"
        raise
    finally:
        if pending:
            await _cancel(pending)
        if run:
            run.end(status)
        await stop_policies(policies)


def _start_rollouts(job: _Job, step: int) -> _Rollouts:
    """Draw the step's rows and start their rollouts through the gates (waiting while held)."""
    position = job.loader.position
    rows = job.loader.next_batch()
    traced = job.run is not None and job.config.tracking.traces != "off"
    task = asyncio.ensure_future(arollout_batch(
        job.graph, rows, job.engines, tokenizer=job.tokenizer,
        config=_rollout_config(job.config, step), input_fn=job.input_fn, record_events=traced,
    ))
    return _Rollouts(step, rows, position, task, time.perf_counter())


async def _cancel(rollouts: _Rollouts) -> None:
    rollouts.task.cancel()
    await asyncio.gather(rollouts.task, return_exceptions=True)


async def _step(
    job: _Job, current: _Rollouts, *, prefetch: bool
) -> tuple[dict[str, float], _Rollouts | None]:
    """One policy update: rollouts, rewards, advantages, update, weight sync.

    With ``prefetch``, the next step's rollouts start behind the closed gate once this
    step's batch is scored, and the gate opens after the weight sync; they are returned.
    """
    config = job.config
    trajectories = await current.task
    # Sampling time only: a prefetched step's rollouts wait at the gate until it opens.
    opened = max(p.gate.opened_at for p in job.policies.values())
    rollout_s = time.perf_counter() - max(current.started, opened)
    counts = await score(
        trajectories,
        {row_id_of(r): r for r in current.rows},
        job.reward_fn,
        on_error=config.reward.on_error,
        failed_rollout_reward=config.reward.failed_rollout_reward,
    )
    samples, sample_metrics = build_samples(
        trajectories, estimator=config.algorithm.advantage_estimator,
        policies=[p.name for p in job.trained],
    )
    metrics = {**rollout_metrics(trajectories, rollout_s), **sample_metrics}
    metrics.update({f"count/{k}": float(v) for k, v in counts.items()})
    if job.run is not None and config.tracking.traces != "off":
        metrics.update(_log_traces(job, job.run, current.step, trajectories, samples))
    upcoming = None
    if prefetch:
        for policy in job.policies.values():
            policy.gate.hold()
        upcoming = _start_rollouts(job, current.step + 1)
    try:
        started = time.perf_counter()
        updates = await asyncio.gather(*(
            _update(policy, current.step, [s for s in samples if s.policy == policy.name])
            for policy in job.trained
        ))
        for update in updates:
            metrics.update(update)
        metrics["time/train_s"] = time.perf_counter() - started
        started = time.perf_counter()
        for policy in job.trained:
            versions = await policy.weight_sync.push(policy.group, [policy.engine])
            metrics[policy.prefix("policy_version").rstrip("/")] = float(versions[0])
        metrics["time/weight_sync_s"] = time.perf_counter() - started
    except BaseException:
        if upcoming:
            await _cancel(upcoming)
        raise
    finally:
        for policy in job.policies.values():
            policy.gate.release()
    return metrics, upcoming


async def _update(policy: Policy, step: int, samples: list) -> dict[str, float]:
    """One policy's update on its samples (none: no update, nothing logged)."""
    if not samples:
        return {}
    update = await asyncio.to_thread(policy.group.update, Batch(step=step, samples=samples))
    return {f"{policy.prefix('train')}{k}": v for k, v in update.items()}


def _log_traces(
    job: _Job, run: TrainingRun, step: int, trajectories: list[Trajectory], samples: list[Sample]
) -> dict[str, float]:
    """Trace the step's sampled rollouts: built here, written by the run's writer process while
    the trainer updates and the next rollouts run (off this process's GIL)."""
    started = time.perf_counter()
    tracking = job.config.tracking
    ids = run.log_traces(
        step, trajectories, sampling=tracking.traces, k=tracking.traces_k,
        credit=rollout_credit(samples, job.config.algorithm.agg), tokenizer=job.tokenizer,
        background=True,
    )
    return {"traces/logged": float(len(ids)), "traces/write_errors": float(run.trace_write_errors),
            "traces/lost": float(run.traces_lost),
            "time/traces_build_s": time.perf_counter() - started}


def _rollout_config(config: TrainConfig, step: int) -> RolloutConfig:
    """The step's rollout config: a seeded run draws new samples each step, and a resumed
    run draws exactly the samples the uninterrupted run would have."""
    sampling = config.rollout.sampling
    if sampling.seed is None:
        return config.rollout
    seeded = sampling.model_copy(update={"seed": sampling.seed + step})
    return config.rollout.model_copy(update={"sampling": seeded})


def _start_run(config: TrainConfig) -> TrainingRun | None:
    if not config.tracking.enabled:
        return None
    run = TrainingRun(config.tracking.uri, config.tracking.experiment, config.tracking.run_name)
    run.log_config(config.model_dump(mode="json"))
    return run


async def _maybe_resume(job: _Job, console: Console) -> int:
    """The step to start from: 0, or the newest checkpoint's (weights pushed to the engines)."""
    checkpoint = job.config.checkpoint
    if not checkpoint.resume:
        return 0
    latest = _latest_checkpoint(Path(checkpoint.dir))
    if latest is None:
        console.log(f"no checkpoint in {checkpoint.dir}: starting from step 0")
        return 0
    extra: dict[str, Any] = {}
    for policy in job.trained:
        path = policy.checkpoint_dir(checkpoint.dir) / latest.name
        loaded = await asyncio.to_thread(policy.group.load_checkpoint, path)
        extra = loaded if policy.name == DEFAULT_POLICY else extra
        await policy.weight_sync.push(policy.group, [policy.engine])
    job.loader.position = LoaderPosition.model_validate(extra["data_position"])
    console.log(f"resumed from {latest} at step {extra['step']}")
    return int(extra["step"])


def _latest_checkpoint(directory: Path) -> Path | None:
    steps = sorted(directory.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return steps[-1] if steps else None


async def _save(job: _Job, step: int, position: LoaderPosition) -> str:
    """Checkpoint every trained policy after ``step`` steps; ``position`` is where the next
    step's rows start. Returns the default policy's checkpoint folder."""
    extra = {"step": step, "data_position": position.model_dump()}
    root = job.config.checkpoint.dir
    for policy in job.trained:
        path = policy.checkpoint_dir(root) / f"step_{step}"
        await asyncio.to_thread(policy.group.save_checkpoint, path, extra)
        if job.run and job.config.tracking.log_checkpoints:
            name = f"checkpoints/{path.relative_to(root)}"
            await asyncio.to_thread(job.run.log_artifacts, path, name)
    return str(Path(root) / f"step_{step}")


async def _finish(job: _Job, result: TrainResult, run: TrainingRun | None) -> TrainResult:
    """Checkpoint the last step (if not yet) and export the final policies."""
    checkpoint = job.config.checkpoint
    if checkpoint.dir:
        if result.checkpoint is None or not result.checkpoint.endswith(f"step_{result.steps}"):
            result.checkpoint = await _save(job, result.steps, job.loader.position)
        if checkpoint.export_final:
            for policy in job.trained:
                final = policy.checkpoint_dir(checkpoint.dir) / "final_model"
                await asyncio.to_thread(policy.group.export_pretrained, final)
                if policy.name == DEFAULT_POLICY:
                    result.final_model = str(final)
                else:
                    result.final_models[policy.name] = str(final)
                if run:
                    run.log_artifacts(final, policy.prefix("final_model").rstrip("/"))
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
