"""A job's checkpoints: resume from the newest, save and prune, export the final policies."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console

from agentrl_sdk.data import LoaderPosition
from agentrl_sdk.pipeline.policies import DEFAULT_POLICY
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.tracing import TrainingRun

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.job import Job

__all__ = ["PIPELINE_STATE", "finish", "maybe_resume", "prune_checkpoints", "save_checkpoint"]

PIPELINE_STATE = "pipeline_state.json"
"""The file in a checkpoint folder with the pipeline's own state (the fully-async queue)."""


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
        loaded = await run_blocking(policy.group.load_checkpoint, path)
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
        await run_blocking(policy.group.save_checkpoint, path, extra)
        if state is not None and policy.name == DEFAULT_POLICY:
            (path / PIPELINE_STATE).write_text(state.model_dump_json())
        if job.run and job.config.tracking.log_checkpoints:
            name = f"checkpoints/{path.relative_to(root)}"
            await run_blocking(job.run.log_artifacts, path, name)
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
                await run_blocking(policy.group.export_pretrained, final)
                if policy.name == DEFAULT_POLICY:
                    result.final_model = str(final)
                else:
                    result.final_models[policy.name] = str(final)
                if run:
                    run.log_artifacts(final, policy.prefix("final_model").rstrip("/"))
    return result
