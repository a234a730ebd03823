"""What the sync and fully-async pipelines share: a job's spec and setup, its rollouts' scoring
and samples, its update and weight push. Checkpoints, progress and results have their own
modules."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agentrl_sdk.chat.recorder import SharedEngine
from agentrl_sdk.data import RowLoader
from agentrl_sdk.engines import Engine
from agentrl_sdk.pipeline.checkpoints import checkpoint_run_id, note_run
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.critic import score_values, start_critics, stop_critics, update_critic
from agentrl_sdk.pipeline.leftovers import forget_processes, note_processes, stop_leftovers
from agentrl_sdk.pipeline.metrics import rollout_metrics
from agentrl_sdk.pipeline.policies import (
    DEFAULT_POLICY,
    Policy,
    model_path,
    start_policies,
    stop_policies,
)
from agentrl_sdk.pipeline.results import TrainResult
from agentrl_sdk.rollout import default_input, row_id_of
from agentrl_sdk.rollout.credit import credit_policies, flat_groups
from agentrl_sdk.rollout.overlong import add_overlong_penalties, truncated
from agentrl_sdk.rollout.rewards import RewardFn, check_reward_fn, score
from agentrl_sdk.rollout.samples import build_samples
from agentrl_sdk.rollout.tree import check_forkable
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.tracing import TrainingRun, rollout_credit
from agentrl_sdk.trainer.critic import CriticGroup
from agentrl_sdk.types import Batch, Sample, Trajectory


@dataclass(frozen=True)
class JobSpec:
    """What a job runs: the user's graph on rows, its reward, and the config.

    Args:
        graph: The compiled LangGraph graph (or agent function).
        rows: The dataset rows (training rows, or the rows an evaluation rolls out).
        reward_fn: Scores a finished rollout; None when the graph emits its rewards itself.
        config: The whole job's configuration.
        input_fn: Turns a row into the graph's input.
        skipped_rows: Dataset rows that failed validation (reported and logged).
        eval_rows: Held-out rows that ``config.evaluation`` evaluates on.
    """

    graph: Any
    rows: list[dict[str, Any]]
    reward_fn: RewardFn | None
    config: TrainConfig
    input_fn: Callable[[dict[str, Any]], Any] = default_input
    skipped_rows: int = 0
    eval_rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_reward_fn(self.reward_fn)
        check_forkable(self.graph, self.config.rollout.tree)


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
    critics: dict[str, CriticGroup] = field(default_factory=dict)  # by policy (gae only)

    @property
    def trained(self) -> list[Policy]:
        return [p for p in self.policies.values() if p.group is not None]

    @property
    def engines(self) -> Mapping[str, Engine]:
        """What rollouts call, by policy name: every policy's gate (with one policy, its gate
        serves whatever policy a node names, as one engine does in ``sdk.rollout``)."""
        return self._by_policy({name: p.gate for name, p in self.policies.items()})

    @property
    def ungated_engines(self) -> Mapping[str, Engine]:
        """As `engines`, past the gates: what an evaluation calls while the gates hold the
        training rollouts back."""
        return self._by_policy({name: p.gate.engine for name, p in self.policies.items()})

    def _by_policy(self, engines: dict[str, Engine]) -> Mapping[str, Engine]:
        if len(engines) == 1:
            return SharedEngine(engines[DEFAULT_POLICY])
        return engines

    @property
    def traced(self) -> bool:
        """Whether rollouts record events for MLflow traces."""
        return self.run is not None and self.config.tracking.traces != "off"


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
                end_run(run, status, result, timeout_s)


def end_run(run: TrainingRun, status: str, result: TrainResult, timeout_s: float) -> None:
    """End the run (never raises) and record in ``result`` what tracking could not write."""
    run.end(status, timeout=timeout_s)
    health = run.health()
    result.tracking_failed_writes = int(health["tracking/failed_writes"])
    result.tracking_dropped_writes = int(health["tracking/dropped_writes"])


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


def shape_rewards(job: Job, trajectories: list[Trajectory]) -> dict[str, float]:
    """Training's reward shaping, in place: the over-long penalty when configured (evaluations
    score without it). Returns the ``count/...`` metrics."""
    overlong = job.config.algorithm.overlong
    if not overlong.buffer:
        return {}
    penalised = add_overlong_penalties(
        trajectories, max_length=job.config.rollout.sampling.max_tokens,
        buffer=overlong.buffer, penalty=overlong.penalty,
    )  # fmt: skip
    return {"count/overlong_penalised_calls": float(penalised)}


def trainable(job: Job, trajectories: list[Trajectory]) -> list[Trajectory]:
    """The rollouts training may use: truncated ones left out when configured."""
    if not job.config.algorithm.overlong.drop_truncated:
        return trajectories
    return [t for t in trajectories if not truncated(t)]


def rows_with_signal(job: Job, trajectories: list[Trajectory]) -> list[str]:
    """The rows (first-seen order) with at least one ``(row, policy)`` group whose rewards
    differ: what dynamic sampling counts toward a batch."""
    credits = credit_policies(
        trainable(job, trajectories), policies=[p.name for p in job.trained],
        outcome_weight=job.config.algorithm.outcome_reward_weight,
    )  # fmt: skip
    flat = flat_groups(credits)
    return list(dict.fromkeys(c.traj.row_id for c in credits if c.group not in flat))


async def batch_samples(
    job: Job,
    trajectories: list[Trajectory],
    rollout_s: float,
) -> tuple[list[Sample], dict[str, float]]:
    """The step's training samples with the estimator's token advantages (from the critics'
    values, when it reads them: `score_values`), and the rollout and estimator metrics."""
    algorithm = job.config.algorithm
    kept = trainable(job, trajectories)
    dropped = len(trajectories) - len(kept)
    samples, sample_metrics = build_samples(
        kept, estimator=algorithm.estimator,
        policies=[p.name for p in job.trained], outcome_weight=algorithm.outcome_reward_weight,
        drop_flat_groups=algorithm.dynamic_sampling.enabled,
    )  # fmt: skip
    sample_metrics["rollouts_dropped_truncated"] = float(dropped)
    samples, critic_metrics = await score_values(job, samples)  # when it reads values
    return samples, {**rollout_metrics(trajectories, rollout_s), **sample_metrics,
                     **critic_metrics}


async def update_policies(job: Job, step: int, samples: list[Sample]) -> dict[str, float]:
    """Every trained policy's update on its own samples, concurrently, then every critic's;
    plus ``time/train_s``. In the first ``critic.warmup_updates`` steps only the critics train.

    The critics wait for the policies: a critic's and a policy's batch sent to their Ray
    actors from two threads at once crashed Ray's driver (an object id created twice).
    """
    started = time.perf_counter()
    warmup = bool(job.critics) and step < job.config.critic.warmup_updates
    own = {p.name: [s for s in samples if s.policy == p.name] for p in job.trained}
    updates = await asyncio.gather(*(
        update_policy(policy, step, own[policy.name]) for policy in job.trained if not warmup
    ))  # fmt: skip
    for name, critic in job.critics.items():
        updates.append(await update_critic(critic, name, step, own.get(name, [])))
    metrics: dict[str, float] = {}
    for update in updates:
        metrics.update(update)
    if job.critics:
        metrics["critic/warmup"] = float(warmup)
    metrics["time/train_s"] = time.perf_counter() - started
    return metrics


async def push_weights(job: Job, version: int) -> dict[str, float]:
    """Push every trained policy's weights to its engine as ``version`` (the updates they
    have seen); the versions, the bytes each push moved (``weight_sync/bytes``: an adapter's
    with ``trainer.lora.sync=adapter``) and the time."""
    started = time.perf_counter()
    metrics: dict[str, float] = {}
    for policy in job.trained:
        stats = await policy.weight_sync.push(policy.group.weights, [policy.engine], version)
        metrics[policy.prefix("policy_version").rstrip("/")] = float(stats.version)
        metrics[f"{policy.prefix('weight_sync')}bytes"] = float(stats.bytes)
    metrics["time/weight_sync_s"] = time.perf_counter() - started
    return metrics


async def update_policy(policy: Policy, step: int, samples: list) -> dict[str, float]:
    """One policy's update on its samples (none: no update, nothing logged).

    A batch in which no token has an advantage (every group's rewards agreed) takes no
    optimizer step, counted as ``train/skipped_no_signal``: with nothing to learn, AdamW's
    momentum and decay would still move the weights.
    """
    if not samples:
        return {}
    prefix = policy.prefix("train")
    if not any(s.carries_signal for s in samples):
        return {f"{prefix}skipped_no_signal": 1.0, f"{prefix}optimizer_steps": 0.0}
    update = await run_blocking(policy.group.update, Batch(step=step, samples=samples))
    return {f"{prefix}{k}": v for k, v in update.items()} | {f"{prefix}skipped_no_signal": 0.0}


def trace_step(
    job: Job, step: int, trajectories: list[Trajectory], samples: list[Sample]
) -> dict[str, float]:
    """Trace the step's sampled rollouts when tracing is on (else nothing): built here, written
    by the run's writer process while the trainer updates and the next rollouts run (off this
    process's GIL). Returns the ``traces/...`` metrics."""
    run = job.run
    if run is None or not job.traced:
        return {}
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
