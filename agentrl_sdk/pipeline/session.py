"""A job's session: its MLflow run, engines and trainers, opened around its steps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from rich.console import Console

from agentrl_sdk.data import RowLoader
from agentrl_sdk.pipeline.checkpoints import checkpoint_run_id, note_run
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.job import Job, JobSpec
from agentrl_sdk.pipeline.leftovers import forget_processes, note_processes, stop_leftovers
from agentrl_sdk.pipeline.policies import (
    Policy,
    model_path,
    start_critics,
    start_policies,
    stop_critics,
    stop_policies,
)
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.tracing import TrainingRun
from agentrl_sdk.trainer.critic import CriticGroup

__all__ = ["open_job", "open_run", "start_run"]


@contextlib.asynccontextmanager
async def open_job(
    spec: JobSpec, *, console: Console, trainers: bool = True
) -> AsyncIterator[tuple[Job, TrainResult]]:
    """Open the job's MLflow run (first: a bad tracking URI fails in seconds, before anything
    expensive starts), start its engines and trainers (unless ``trainers`` is False: an
    evaluation); at the end stop the engines and trainers, then end the run with the job's
    outcome, whatever happens."""
    from transformers import AutoTokenizer

    config, skipped_rows = spec.config, spec.skipped_rows
    tokenizer = AutoTokenizer.from_pretrained(model_path(config.model), local_files_only=True)
    data = config.data
    # An evaluation draws no batches: any batch size its rows allow will do.
    batch_size = data.batch_size if trainers else 1
    loader = RowLoader(spec.rows, batch_size, shuffle=data.shuffle, seed=data.seed)
    run = await run_blocking(open_run if trainers else start_run, config)
    status = "FAILED"
    policies: dict[str, Policy] = {}
    critics: dict[str, CriticGroup] = {}
    result = TrainResult(steps=0, run_id=run.run_id if run else None, skipped_rows=skipped_rows)
    # A killed driver's Ray processes outlive it: the job's next start stops them.
    noted = Path(config.checkpoint.dir) if trainers and config.checkpoint.dir else None
    try:
        if noted:
            await run_blocking(stop_leftovers, noted)
        policies = await start_policies(config, trainers=trainers)
        if trainers:
            critics = await start_critics(config, list(policies.values()))
        if noted:
            await run_blocking(note_processes, noted)
        job = Job(spec.graph, spec.reward_fn, spec.input_fn, config, tokenizer, loader, policies,
                  run, eval_rows=list(spec.eval_rows), critics=critics)
        if skipped_rows:
            console.log(f"[yellow]{skipped_rows} dataset rows failed validation and are left out")
            if run:
                run.log_metrics(0, {"data/skipped_rows": float(skipped_rows)})
        yield job, result
        status = "KILLED" if result.stopped else "FINISHED"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "KILLED"
        raise
    finally:
        try:
            await stop_critics(critics)  # first: the policies' first trainer may own Ray
            await stop_policies(policies)
            if noted:
                forget_processes(noted)
        finally:
            if run:
                timeout_s = config.tracking.end_timeout_s
                if status == "KILLED" and not result.stopped:  # a second Ctrl-C: stop now
                    timeout_s = min(timeout_s, 5.0)
                run.end(status, timeout=timeout_s)  # never raises
                # What tracking could not write is in the result.
                health = run.health()
                result.tracking_failed_writes = int(health["tracking/failed_writes"])
                result.tracking_dropped_writes = int(health["tracking/dropped_writes"])


def open_run(config: TrainConfig) -> TrainingRun | None:
    """A training job's MLflow run: its checkpoint's run again when resuming one (the run a
    driver killed before its first checkpoint started, too: `note_run`). Starting over
    instead, a run the checkpoint's driver left RUNNING (it was killed) is marked KILLED."""
    previous = checkpoint_run_id(config)
    resume = config.checkpoint.resume
    run = start_run(config, previous if resume else None)
    if run and previous and not resume:
        run.end_abandoned(previous)
    note_run(config, run.run_id if run else None)
    return run


def start_run(config: TrainConfig, run_id: str | None = None) -> TrainingRun | None:
    """The job's MLflow run (``run_id``'s again when given: a resumed job) with its config
    logged, or None when tracking is off. Raises `TrackingError` when the store is unreachable."""
    tracking = config.tracking
    if not tracking.enabled:
        return None
    run = TrainingRun(tracking.uri, tracking.experiment, tracking.run_name, run_id=run_id,
                      timeout_s=tracking.timeout_s)
    if run_id is None:  # a reopened run has its params (MLflow refuses to change them)
        run.log_config(config.model_dump(mode="json"))
    return run
