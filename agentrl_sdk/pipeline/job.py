"""What the sync and fully-async pipelines share: a job's setup, its update, weight push and
checkpoints, and the per-step display."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.data import LoaderPosition, RowLoader
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.policies import (
    DEFAULT_POLICY,
    Policy,
    model_path,
    start_policies,
    stop_policies,
)
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.rollout import row_id_of
from agentrl_sdk.rollout.rewards import RewardFn, score
from agentrl_sdk.rollout.samples import build_samples
from agentrl_sdk.tracing import TrainingRun, rollout_credit
from agentrl_sdk.types import Batch, Sample, Trajectory


class EvalResult(BaseModel):
    """What an evaluation of held-out rows found (``sdk.evaluate``, or during training)."""

    step: int = Field(description="Policy updates done when evaluated (0: starting weights).")
    metrics: dict[str, float] = Field(
        description="reward/mean and /std, per component, pass@k, status counts, tokens."
    )
    run_id: str | None = None
    trajectories: list[Trajectory] = Field(
        default_factory=list, repr=False, description="The scored rollouts (`sdk.evaluate` "
        "keeps them; evaluations during training do not)."
    )


class TrainResult(BaseModel):
    """What a training job leaves behind."""

    steps: int
    history: list[dict[str, float]] = Field(default_factory=list)
    evaluations: list[EvalResult] = Field(
        default_factory=list, description="Evaluations on the held-out rows, in update order."
    )
    run_id: str | None = None
    final_model: str | None = None
    final_models: dict[str, str] = Field(default_factory=dict)  # other trained policies
    checkpoint: str | None = None
    skipped_rows: int = 0


PIPELINE_STATE = "pipeline_state.json"
"""The file in a checkpoint folder with the pipeline's own state (the fully-async queue)."""


@dataclass
class Job:
    """Everything one training job's steps share."""

    graph: Any
    reward_fn: RewardFn | None
    input_fn: Callable[[dict[str, Any]], Any]
    config: TrainConfig
    tokenizer: Any
    loader: RowLoader
    policies: dict[str, Policy]
    run: TrainingRun | None = None
    eval_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trained(self) -> list[Policy]:
        return [p for p in self.policies.values() if p.group is not None]

    @property
    def engines(self) -> Any:
        """What rollouts call: the gate of the one policy, or every policy's gate by name."""
        gates = {name: p.gate for name, p in self.policies.items()}
        return gates[DEFAULT_POLICY] if len(gates) == 1 else gates

    @property
    def traced(self) -> bool:
        """Whether rollouts record events for MLflow traces."""
        return self.run is not None and self.config.tracking.traces != "off"


@contextlib.asynccontextmanager
async def open_job(
    graph: Any,
    rows: list[dict[str, Any]],
    reward_fn: RewardFn | None,
    config: TrainConfig,
    *,
    input_fn: Callable[[dict[str, Any]], Any],
    console: Console,
    skipped_rows: int = 0,
    eval_rows: list[dict[str, Any]] | None = None,
    trainers: bool = True,
) -> AsyncIterator[tuple[Job, TrainResult]]:
    """Start a job's engines, trainers (unless ``trainers`` is False: an evaluation) and
    MLflow run; end the run with the job's outcome and tear everything down whatever happens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path(config.model), local_files_only=True)
    data = config.data
    # An evaluation draws no batches: any batch size its rows allow will do.
    batch_size = data.batch_size if trainers else 1
    loader = RowLoader(rows, batch_size, shuffle=data.shuffle, seed=data.seed)
    policies = await start_policies(config, trainers=trainers)
    run: TrainingRun | None = None
    status = "FAILED"
    try:
        run = start_run(config)
        job = Job(graph, reward_fn, input_fn, config, tokenizer, loader, policies, run,
                  eval_rows=list(eval_rows or []))
        result = TrainResult(steps=0, run_id=run.run_id if run else None, skipped_rows=skipped_rows)
        if skipped_rows:
            console.log(f"[yellow]{skipped_rows} dataset rows failed validation and are left out")
            if run:
                run.log_metrics(0, {"data/skipped_rows": float(skipped_rows)})
        yield job, result
        status = "FINISHED"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "KILLED"
        raise
    finally:
        if run:
            run.end(status)
        await stop_policies(policies)


async def score_rollouts(
    job: Job, trajectories: list[Trajectory], rows: list[dict[str, Any]]
) -> dict[str, float]:
    """Reward every trajectory in place; returns the ``count/...`` metrics of the outcomes."""
    reward = job.config.reward
    counts = await score(
        trajectories, {row_id_of(r): r for r in rows}, job.reward_fn,
        on_error=reward.on_error, failed_rollout_reward=reward.failed_rollout_reward,
    )  # fmt: skip
    return {f"count/{k}": float(v) for k, v in counts.items()}


def batch_samples(
    job: Job, step: int, trajectories: list[Trajectory], rollout_s: float
) -> tuple[list[Sample], dict[str, float]]:
    """The step's training samples (group advantages) and rollout metrics; traces the step's
    sampled rollouts when tracing is on."""
    samples, sample_metrics = build_samples(
        trajectories, estimator=job.config.algorithm.advantage_estimator,
        policies=[p.name for p in job.trained],
    )  # fmt: skip
    metrics = {**rollout_metrics(trajectories, rollout_s), **sample_metrics}
    if job.traced:
        assert job.run is not None
        metrics.update(log_traces(job, job.run, step, trajectories, samples))
    return samples, metrics


async def update_policies(job: Job, step: int, samples: list[Sample]) -> dict[str, float]:
    """Every trained policy's update on its own samples, concurrently; plus ``time/train_s``."""
    started = time.perf_counter()
    updates = await asyncio.gather(*(
        update_policy(policy, step, [s for s in samples if s.policy == policy.name])
        for policy in job.trained
    ))  # fmt: skip
    metrics: dict[str, float] = {}
    for update in updates:
        metrics.update(update)
    metrics["time/train_s"] = time.perf_counter() - started
    return metrics


async def push_weights(job: Job) -> dict[str, float]:
    """Push every trained policy's weights to its engine; the new versions and the time."""
    started = time.perf_counter()
    metrics: dict[str, float] = {}
    for policy in job.trained:
        versions = await policy.weight_sync.push(policy.group, [policy.engine])
        metrics[policy.prefix("policy_version").rstrip("/")] = float(versions[0])
    metrics["time/weight_sync_s"] = time.perf_counter() - started
    return metrics


async def update_policy(policy: Policy, step: int, samples: list) -> dict[str, float]:
    """One policy's update on its samples (none: no update, nothing logged)."""
    if not samples:
        return {}
    update = await asyncio.to_thread(policy.group.update, Batch(step=step, samples=samples))
    return {f"{policy.prefix('train')}{k}": v for k, v in update.items()}


def log_traces(
    job: Job, run: TrainingRun, step: int, trajectories: list[Trajectory], samples: list[Sample]
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


def rollout_config(config: TrainConfig, step: int) -> RolloutConfig:
    """The step's rollout config: a seeded run draws new samples each step, and a resumed
    run draws exactly the samples the uninterrupted run would have."""
    sampling = config.rollout.sampling
    if sampling.seed is None:
        return config.rollout
    seeded = sampling.model_copy(update={"seed": sampling.seed + step})
    return config.rollout.model_copy(update={"sampling": seeded})


def start_run(config: TrainConfig) -> TrainingRun | None:
    """The job's MLflow run with its config logged, or None when tracking is off."""
    if not config.tracking.enabled:
        return None
    run = TrainingRun(config.tracking.uri, config.tracking.experiment, config.tracking.run_name)
    run.log_config(config.model_dump(mode="json"))
    return run


async def maybe_resume(job: Job, console: Console) -> tuple[int, Path | None]:
    """The step to start from and the checkpoint folder it comes from: (0, None), or the
    newest checkpoint's (its weights pushed to the engines)."""
    checkpoint = job.config.checkpoint
    if not checkpoint.resume:
        return 0, None
    latest = _latest_checkpoint(Path(checkpoint.dir))
    if latest is None:
        console.log(f"no checkpoint in {checkpoint.dir}: starting from step 0")
        return 0, None
    extra: dict[str, Any] = {}
    for policy in job.trained:
        path = policy.checkpoint_dir(checkpoint.dir) / latest.name
        loaded = await asyncio.to_thread(policy.group.load_checkpoint, path)
        extra = loaded if policy.name == DEFAULT_POLICY else extra
        await policy.weight_sync.push(policy.group, [policy.engine])
    job.loader.position = LoaderPosition.model_validate(extra["data_position"])
    console.log(f"resumed from {latest} at step {extra['step']}")
    return int(extra["step"]), latest


def _checkpoints(directory: Path) -> list[Path]:
    """The ``step_<n>`` folders in ``directory``, oldest first."""
    found = [p for p in directory.glob("step_*") if p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _latest_checkpoint(directory: Path) -> Path | None:
    steps = _checkpoints(directory)
    return steps[-1] if steps else None


def prune_checkpoints(directory: Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoint folders (none when ``keep`` is None);
    returns what was deleted."""
    stale = _checkpoints(directory)[:-keep] if keep else []
    for folder in stale:
        shutil.rmtree(folder)
    return stale


async def save_checkpoint(
    job: Job, step: int, position: LoaderPosition, state: BaseModel | None = None
) -> str:
    """Checkpoint every trained policy after ``step`` steps; ``position`` is where the next
    step's rows start and ``state`` what else the pipeline needs to continue (written as
    `PIPELINE_STATE` beside the default policy's checkpoint). Returns that folder."""
    extra = {"step": step, "data_position": position.model_dump()}
    root = job.config.checkpoint.dir
    for policy in job.trained:
        path = policy.checkpoint_dir(root) / f"step_{step}"
        await asyncio.to_thread(policy.group.save_checkpoint, path, extra)
        if state is not None and policy.name == DEFAULT_POLICY:
            (path / PIPELINE_STATE).write_text(state.model_dump_json())
        if job.run and job.config.tracking.log_checkpoints:
            name = f"checkpoints/{path.relative_to(root)}"
            await asyncio.to_thread(job.run.log_artifacts, path, name)
        prune_checkpoints(path.parent, job.config.checkpoint.keep_last)
    return str(Path(root) / f"step_{step}")


async def finish(job: Job, result: TrainResult, run: TrainingRun | None) -> TrainResult:
    """Checkpoint the last step (if not yet) and export the final policies."""
    checkpoint = job.config.checkpoint
    if checkpoint.dir:
        if result.checkpoint is None or not result.checkpoint.endswith(f"step_{result.steps}"):
            result.checkpoint = await save_checkpoint(job, result.steps, job.loader.position)
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
                job.run.log_metrics(step, metrics)
            progress.update(task, advance=1, reward=metrics["reward/mean"])
            console.log(step_line(step, metrics))
            every = config.checkpoint.every
            return bool(config.checkpoint.dir and every and (step + 1) % every == 0)

        yield record


def step_line(step: int, m: dict[str, float]) -> str:
    """One step's summary line on the terminal."""
    return (
        f"step {step + 1}: reward {m['reward/mean']:.3f} ± {m['reward/std']:.3f} · "
        f"loss {m.get('train/loss', float('nan')):.4f} · "
        f"{m['tokens/generated_per_s']:.0f} tok/s · rollout {m['time/rollout_s']:.1f}s · "
        f"train {m['time/train_s']:.1f}s · sync {m['time/weight_sync_s']:.2f}s"
        # What decides whether GRPO can learn: groups whose rewards all agree give no gradient.
        f" · entropy {m.get('train/entropy', float('nan')):.3f} · flat groups "
        f"{m.get('adv_zero_std_group_frac', float('nan')):.0%}"
    )
