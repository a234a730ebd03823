"""Observability: MLflow runs and per-rollout traces for training jobs, trajectories for people."""

from agentrl_sdk.tracing.mlflow_run import TrainingRun, flatten, package_versions
from agentrl_sdk.tracing.render import legend, render_segment, render_trajectory
from agentrl_sdk.tracing.traces import (
    RolloutCredit,
    TraceSampling,
    build_trace,
    rollout_credit,
    select_rollouts,
    trace_tags,
    write_traces,
)

__all__ = [
    "RolloutCredit",
    "TraceSampling",
    "TrainingRun",
    "build_trace",
    "flatten",
    "legend",
    "package_versions",
    "render_segment",
    "render_trajectory",
    "rollout_credit",
    "select_rollouts",
    "trace_tags",
    "write_traces",
]
