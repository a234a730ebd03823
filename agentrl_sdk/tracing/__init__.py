"""Observability: rendering trajectories for people (MLflow runs and traces come next)."""

from agentrl_sdk.tracing.render import legend, render_segment, render_trajectory

__all__ = ["legend", "render_segment", "render_trajectory"]
