"""`ServeConfig`: where a served graph listens, who may call it, and where its traces go."""

from __future__ import annotations

from pydantic import Field, model_validator

from agentrl_sdk.gateway.config import ListenConfig, is_loopback

__all__ = ["ServeConfig"]


class ServeConfig(ListenConfig):
    """How a graph is served (`agentrl_sdk.serve`, ``agentrl serve``)."""

    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str | None = Field(
        None, description="Bearer token every route but /health requires; None: no auth "
        "(allowed on a loopback host only, unless allow_unauthenticated_remote).",
    )
    tracking_uri: str | None = Field(
        "sqlite:///mlflow.db", description="MLflow store each request's trace is written to; "
        "None serves without traces.",
    )
    experiment: str = Field("agentrl-serve", description="MLflow experiment of the traces.")
    tags: dict[str, str] = Field(
        default_factory=dict, description="Tags on every trace (e.g. a deployment name); a "
        "request's own tags are added to them.",
    )
    max_pending_traces: int = Field(
        10_000, ge=1, description="Most traces waiting to be written; past it a request's "
        "trace is dropped and counted (traces_dropped in /health), the request is still served.",
    )
    close_timeout_s: float = Field(
        30.0, ge=0, description="How long stopping waits for queued traces to be written; "
        "the rest are counted lost.",
    )

    @model_validator(mode="after")
    def _reachable_only_with_a_key(self) -> ServeConfig:
        if not (self.api_key or is_loopback(self.host) or self.allow_unauthenticated_remote):
            raise ValueError(
                f"host {self.host!r} is not a loopback address and no api_key is set: anyone "
                "who can reach the port could run the graph. Set api_key, bind 127.0.0.1, or "
                "set allow_unauthenticated_remote"
            )
        return self
