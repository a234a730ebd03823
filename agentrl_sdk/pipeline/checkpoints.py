"""A job's checkpoints: resume from the newest, save and prune, export the final policies."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from rich.console import Console

from agentrl_sdk.data import LoaderPosition
from agentrl_sdk.errors import CheckpointError
from agentrl_sdk.pipeline.policies import DEFAULT_POLICY, critic_checkpoint_dir
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.threads import run_blocking

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.config import TrainConfig
    from agentrl_sdk.pipeline.job import Job

__all__ = [
    "MANIFEST",
    "PIPELINE_STATE",
    "RUN_FILE",
    "CheckpointManifest",
    "checkpoint_run_id",
    "finish",
    "maybe_resume",
    "note_run",
    "prune_checkpoints",
    "save_checkpoint",
]

PIPELINE_STATE = "pipeline_state.json"
"""The file in a checkpoint folder with the pipeline's own state (the fully-async queue)."""

MANIFEST = "checkpoint.json"
"""The file that completes a checkpoint folder, written last (a folder without it was cut short)."""


RUN_FILE = "run.json"
"""The file in the checkpoint folder naming the job's MLflow run, written when the job starts:
a driver killed before its first complete checkpoint is resumed from step 0 in that run."""


class CheckpointManifest(BaseModel):
    """What a complete checkpoint holds; its parts are checked against it before a resume."""

    step: int = Field(description="Updates done when it was written.")
    policies: list[str] = Field(description="The trained policies whose trainer state it has.")
    pipeline_state_sha256: str | None = Field(
        None, description=f"Digest of {PIPELINE_STATE} (None: the pipeline keeps no state)."
    )
    run_id: str | None = Field(None, description="The MLflow run a resume continues.")
    critics: list[str] = Field(
        default_factory=list, description="The policies whose critic (value model) state it "
        "has, under each policy's critic/ folder."
    )


async def maybe_resume(job: Job, console: Console) -> tuple[int, Path | None]:
    """The step to start from and the checkpoint folder it comes from: (0, None), or the
    newest complete checkpoint's (checked, its weights pushed to the engines).

    Raises:
        CheckpointError: the checkpoint's parts disagree with its manifest.
    """
    checkpoint = job.config.checkpoint
    if not checkpoint.resume:
        return 0, None
    found = _latest_complete(Path(checkpoint.dir), warn=console.log)
    if found is None:
        console.log(f"no checkpoint in {checkpoint.dir}: starting from step 0")
        _remove_newer(job, 0)
        return 0, None
    latest, manifest = found
    _check_parts(job, latest, manifest)
    _remove_newer(job, manifest.step)
    extra: dict[str, Any] = {}
    for what, group, directory in _trainer_states(job):
        path = directory / latest.name
        extra = await run_blocking(group.load_checkpoint, path)  # each holds the same extra
        if int(extra["step"]) != manifest.step:
            raise CheckpointError(
                f"the {what} in {path} is at step {extra['step']} but {latest / MANIFEST} says "
                f"step {manifest.step}: its parts disagree"
            )
    for policy in job.trained:
        await policy.weight_sync.push(policy.group.weights, [policy.engine], manifest.step)
    job.loader.position = LoaderPosition.model_validate(extra["data_position"])
    console.log(f"resumed from {latest} at step {manifest.step}")
    if job.run:
        job.run.set_tag("resumed_from", str(latest))
    return manifest.step, latest


def checkpoint_run_id(config: TrainConfig) -> str | None:
    """The MLflow run of the newest complete checkpoint in ``checkpoint.dir`` (None: none).

    Raises:
        CheckpointError: resuming, and no step folder there is complete.
    """
    checkpoint = config.checkpoint
    if not checkpoint.dir:
        return None
    try:
        found = _latest_complete(Path(checkpoint.dir), warn=lambda _: None)
    except CheckpointError:
        if checkpoint.resume:
            raise
        return None
    if found:
        return found[1].run_id
    noted = Path(checkpoint.dir) / RUN_FILE
    return json.loads(noted.read_text())["run_id"] if noted.is_file() else None


def note_run(config: TrainConfig, run_id: str | None) -> None:
    """Write `RUN_FILE` for a job that starts (``run_id``: its run, None without tracking)."""
    if config.checkpoint.dir:
        directory = Path(config.checkpoint.dir)
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / RUN_FILE, json.dumps({"run_id": run_id}).encode())


def _trainer_states(job: Job) -> list[tuple[str, Any, Path]]:
    """Every trainer state a checkpoint of ``job`` holds, each trained policy's then each
    critic's: what it is, its trainer group, and the folder of its ``step_*`` checkpoints."""
    root = job.config.checkpoint.dir
    policies = [(f"trainer state of policy {p.name!r}", p.group, p.checkpoint_dir(root))
                for p in job.trained]
    return policies + [(f"critic state of policy {name!r}", critic,
                        critic_checkpoint_dir(job.policies[name], root))
                       for name, critic in job.critics.items()]


def _checkpoints(directory: Path) -> list[Path]:
    """The ``step_<n>`` folders in ``directory``, oldest first."""
    found = [p for p in directory.glob("step_*") if p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _latest_complete(
    directory: Path, warn: Callable[[str], object]
) -> tuple[Path, CheckpointManifest] | None:
    """The newest checkpoint folder with a manifest, and the manifest; newer folders without
    one (a save cut short by a killed driver) are skipped with a warning.

    Raises:
        CheckpointError: there are step folders but none is complete, and no `RUN_FILE` says
            a job of this version (which writes manifests) cut them short.
    """
    folders = _checkpoints(directory)
    for folder in reversed(folders):
        if (folder / MANIFEST).is_file():
            return folder, CheckpointManifest.model_validate_json((folder / MANIFEST).read_text())
        warn(f"[yellow]{folder} is incomplete (no {MANIFEST}: the run stopped while writing "
             f"it): skipped")
    if folders and not (directory / RUN_FILE).is_file():
        raise CheckpointError(
            f"no complete checkpoint in {directory}: none of {[f.name for f in folders]} has "
            f"{MANIFEST} (cut short, or written by an older version); delete them or set "
            f"checkpoint.resume: false"
        )
    return None


def _check_parts(job: Job, folder: Path, manifest: CheckpointManifest) -> None:
    """Refuse a checkpoint whose parts are missing or are not the ones its manifest lists."""
    for kind, listed, trained in (("trainer", manifest.policies, [p.name for p in job.trained]),
                                  ("critic", manifest.critics, list(job.critics))):
        if sorted(listed) != sorted(trained):
            raise CheckpointError(f"{folder / MANIFEST} has {kind} state of policies {listed}, "
                                  f"this job trains {kind}s of {sorted(trained)}")
    for what, _, directory in _trainer_states(job):
        if not (directory / folder.name).is_dir():
            raise CheckpointError(f"{folder} lacks the {what} ({directory / folder.name} is "
                                  "missing)")
    if manifest.pipeline_state_sha256 is None:
        return
    state = folder / PIPELINE_STATE
    if not state.is_file():
        raise CheckpointError(f"{folder} lacks {PIPELINE_STATE} (the queue and unfinished "
                              f"rows): resuming would lose them")
    if _sha256(state.read_bytes()) != manifest.pipeline_state_sha256:
        raise CheckpointError(f"{state} is not the one {folder / MANIFEST} was written with")


def _remove_newer(job: Job, step: int) -> None:
    """Delete the incomplete folders past ``step`` (the resumed run writes those steps again;
    left alone, they would count as newer checkpoints when pruning)."""
    for _, _, directory in _trainer_states(job):
        for folder in _checkpoints(directory):
            if int(folder.name[5:]) > step:
                shutil.rmtree(folder)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def prune_checkpoints(directory: Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoint folders (none when ``keep`` is None);
    returns what was deleted."""
    stale = _checkpoints(directory)[:-keep] if keep else []
    for folder in stale:
        shutil.rmtree(folder)
    return stale


async def save_checkpoint(job: Job, step: int, state: BaseModel | None = None) -> str:
    """Checkpoint every trained policy after ``step`` steps, with where the loader's next rows
    start; ``state`` is what else the pipeline needs to continue (written as `PIPELINE_STATE`
    beside the default policy's checkpoint). The `MANIFEST` is written last, so a save cut
    short leaves a folder a resume skips. Returns that folder."""
    extra = {"step": step, "data_position": job.loader.position.model_dump()}
    root = job.config.checkpoint.dir
    folder = Path(root) / f"step_{step}"
    (folder / MANIFEST).unlink(missing_ok=True)  # rewriting a step: incomplete until done
    digest = None
    states = _trainer_states(job)
    for _, group, directory in states:
        await run_blocking(group.save_checkpoint, directory / folder.name, extra)
    if state is not None:
        data = state.model_dump_json().encode()
        _write_atomic(folder / PIPELINE_STATE, data)
        digest = _sha256(data)
    manifest = CheckpointManifest(
        step=step, policies=[p.name for p in job.trained], pipeline_state_sha256=digest,
        run_id=job.run.run_id if job.run else None, critics=list(job.critics),
    )  # fmt: skip
    _write_atomic(folder / MANIFEST, manifest.model_dump_json(indent=1).encode())
    for _, _, directory in states:
        if job.run and job.config.tracking.log_checkpoints:
            path = directory / folder.name
            job.run.log_artifacts(path, f"checkpoints/{path.relative_to(root)}")
        prune_checkpoints(directory, job.config.checkpoint.keep_last)
    return str(folder)


async def finish(job: Job, result: TrainResult) -> TrainResult:
    """Checkpoint the last step (if not yet) and export the final policies."""
    checkpoint = job.config.checkpoint
    if checkpoint.dir:
        if result.checkpoint is None or not result.checkpoint.endswith(f"step_{result.steps}"):
            result.checkpoint = await save_checkpoint(job, result.steps)
        if checkpoint.export_final:
            for policy in job.trained:
                final = policy.checkpoint_dir(checkpoint.dir) / "final_model"
                await run_blocking(policy.group.export_pretrained, final)
                if policy.name == DEFAULT_POLICY:
                    result.final_model = str(final)
                else:
                    result.final_models[policy.name] = str(final)
                if job.run:
                    job.run.log_artifacts(final, policy.prefix("final_model").rstrip("/"))
    return result
