"""What a training job or an evaluation hands back to the user."""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentrl_sdk.types import Trajectory

__all__ = ["EvalResult", "TrainResult"]


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
    stopped: bool = Field(
        False, description="Stopped early by Ctrl-C; the checkpoint (if checkpoint.dir is set) "
        "resumes it, training every finished step or group once."
    )
    tracking_failed_writes: int = Field(
        0, description="MLflow write attempts that failed (an outage; training went on)."
    )
    tracking_dropped_writes: int = Field(
        0, description="MLflow writes given up (refused, or not done by the end of the run)."
    )
