"""Observability: MLflow runs and per-rollout traces for training jobs, trajectories for people."""

from agentrl_sdk.tracing.mlflow_run import TrainingRun, flatten, package_versions
from agentrl_sdk.tracing.html import trace_html
from agentrl_sdk.tracing.render import legend, render_segment, render_trace, render_trajectory
from agentrl_sdk.tracing.server import MlflowServer, trace_url
from agentrl_sdk.tracing.traces import (
    RolloutCredit,
    TracePayload,
    TraceSampling,
    build_trace,
    build_trace_payload,
    rollout_credit,
    select_rollouts,
    trace_entities,
    trace_tags,
    write_traces,
)
from agentrl_sdk.tracing.writer import TraceWriter
from agentrl_sdk.tracing.view import TraceView, load_trace_view, search_rollout_traces

__all__ = [
    "MlflowServer",
    "RolloutCredit",
    "TracePayload",
    "TraceSampling",
    "TraceView",
    "TraceWriter",
    "TrainingRun",
    "build_trace",
    "build_trace_payload",
    "flatten",
    "legend",
    "load_trace_view",
    "package_versions",
    "render_segment",
    "render_trace",
    "render_trajectory",
    "rollout_credit",
    "search_rollout_traces",
    "select_rollouts",
    "trace_entities",
    "trace_html",
    "trace_tags",
    "trace_url",
    "write_traces",
]
