"""Evaluation on held-out rows: the served weights' rewards and pass@k, during training
(``evaluation.every``) or on its own (``sdk.evaluate``)."""

from __future__ import annotations

import dataclasses
import time

from rich.console import Console
from rich.markup import escape

from agentrl_sdk.engines.gate import held
from agentrl_sdk.pipeline.job import Job, JobSpec
from agentrl_sdk.pipeline.metrics import eval_metrics
from agentrl_sdk.pipeline.progress import log_console
from agentrl_sdk.pipeline.results import EvalResult, TrainResult
from agentrl_sdk.pipeline.rollouter import score_rollouts
from agentrl_sdk.pipeline.session import open_job
from agentrl_sdk.rollout import arollout_batch

__all__ = ["evaluate_job", "maybe_evaluate", "run_evaluation"]


async def evaluate_job(job: Job, updates: int) -> EvalResult:
    """Roll out every held-out row of ``job`` on the weights its engines serve now, score the
    rollouts and log ``eval/...`` metrics (MLflow step = ``updates``) and traces (tag
    ``phase=eval``) to the job's run.

    The weight gates hold training rollouts back meanwhile (those already inside an engine go
    on): the evaluation has the engines to itself instead of sharing them with the next
    step's rows.
    """
    settings = job.config.evaluation
    rows = job.eval_rows[: settings.max_rows]
    started = time.perf_counter()
    with held(p.gate for p in job.policies.values()):
        trajectories = await arollout_batch(
            job.graph, rows, job.ungated_engines, tokenizer=job.tokenizer,
            config=settings.rollout(job.config.rollout), input_fn=job.input_fn,
            record_events=job.traced and settings.traces != "off",
        )  # fmt: skip
    seconds = time.perf_counter() - started
    counts = await score_rollouts(job, trajectories, rows)  # the metrics read the rewards
    metrics = eval_metrics(trajectories, seconds, pass_threshold=settings.pass_threshold) | counts
    if job.run is not None:
        job.run.log_metrics(updates, {f"eval/{k}": v for k, v in metrics.items()})
        if job.traced and settings.traces != "off":
            job.run.log_traces(
                updates, trajectories, sampling=settings.traces, k=job.config.tracking.traces_k,
                tokenizer=job.tokenizer, background=True, phase="eval",
            )  # fmt: skip
    run_id = job.run.run_id if job.run else None
    return EvalResult(step=updates, metrics=metrics, run_id=run_id, trajectories=trajectories)


async def maybe_evaluate(job: Job, result: TrainResult, updates: int, console: Console) -> None:
    """During training: evaluate the weights after ``updates`` updates when
    ``evaluation.every`` says so (and after the last update), and file the result without
    its trajectories."""
    config = job.config
    final = bool(config.evaluation.every) and updates == config.max_steps
    if not job.eval_rows or not (config.evaluation.due(updates) or final):
        return
    # A line before as well: 64 greedy rollouts of a real model take a minute on a laptop.
    rows = len(job.eval_rows[: config.evaluation.max_rows])
    console.log(f"eval after {updates} updates: {rows} held-out rows ...")
    evaluation = await evaluate_job(job, updates)
    result.evaluations.append(evaluation.model_copy(update={"trajectories": []}))
    console.log(eval_line(evaluation))


def eval_line(evaluation: EvalResult, subject: str | None = None) -> str:
    """One evaluation's summary line on the terminal; ``subject`` names what was evaluated
    (default: the weights after the evaluation's updates in training)."""
    m = evaluation.metrics
    passes = " · ".join(f"{k} {v:.3f}" for k, v in m.items() if k.startswith("pass_at_"))
    return (f"eval {subject or f'after {evaluation.step} updates'}: reward {m['reward/mean']:.3f}"
            f" ± {m['reward/std']:.3f} · {passes} · {m.get('rows', 0):.0f} rows")


async def run_evaluation(spec: JobSpec, *, console: Console | None = None) -> EvalResult:
    """Evaluate ``spec.config.model`` (and any other policies) on ``spec.rows``: engines only,
    no trainer; an MLflow run of its own when tracking is on.

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not spec.rows:
        raise ValueError("nothing to evaluate: the dataset has no usable rows")
    console = console or log_console()
    spec = dataclasses.replace(spec, eval_rows=spec.rows)
    async with open_job(spec, console=console, trainers=False) as (job, _):
        rows = len(job.eval_rows[: spec.config.evaluation.max_rows])
        console.log(f"eval: {rows} rows ...")
        evaluation = await evaluate_job(job, 0)
        console.log(eval_line(evaluation, escape(f"of {spec.config.model.path or 'the model'}")))
        return evaluation
