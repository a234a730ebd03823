"""Observability: MLflow runs for training jobs, and trajectories rendered for people."""

from agentrl_sdk.tracing.mlflow_run import TrainingRun, flatten, package_versions
from agentrl_sdk.tracing.render import legend, render_segment, render_trajectory

__all__ = [
    "TrainingRun",
    "flatten",
    "legend",
    "package_versions",
    "render_segment",
    "render_trajectory",
]
