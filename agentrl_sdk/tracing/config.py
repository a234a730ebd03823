"""`TrackingConfig`: the ``tracking`` section of a training config (MLflow runs and traces)."""

from __future__ import annotations

from pydantic import Field

from agentrl_sdk.config import ConfigSection
from agentrl_sdk.tracing.traces import TraceSampling

__all__ = ["TrackingConfig"]


class TrackingConfig(ConfigSection):
    """MLflow tracking: one run per job, one trace per sampled rollout."""

    enabled: bool = Field(
        True, description="Log the job to MLflow (a run with its config, metrics, traces and "
        "checkpoints); False logs nothing."
    )
    uri: str = Field(
        "sqlite:///mlflow.db", description="MLflow tracking URI (sqlite file or `mlflow server`)."
    )
    experiment: str = Field("agentrl", description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name; None lets MLflow pick one.")
    traces: TraceSampling = Field(
        "first_k", description="Rollouts traced per step: all, those of the first traces_k rows, "
        "failures (status not ok) only, or off."
    )
    traces_k: int = Field(1, ge=1, description="Rows whose rollouts are traced per step (first_k).")
    log_checkpoints: bool = Field(
        True, description="Log every checkpoint folder as run artifacts (the final model always)."
    )
    timeout_s: float = Field(
        10.0, gt=0, description="Seconds one request to the tracking store may take. Opening "
        "the run (before any engine starts) makes one attempt and fails with the URI in the "
        "error; later writes are buffered, retried in the background and counted "
        "(tracking/failed_writes), never stopping training."
    )
    end_timeout_s: float = Field(
        120.0, ge=0, description="How long the end of a job waits for buffered writes and "
        "traces to reach the store (after the engines and trainers stopped); what is left is "
        "dropped and counted (tracking/dropped_writes)."
    )
