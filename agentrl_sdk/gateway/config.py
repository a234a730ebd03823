"""`GatewayConfig`: where the recording gateway listens, who may call it, what it serves."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GatewayConfig(BaseModel):
    """How the recording gateway is served."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Interface to listen on; loopback by default.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    auth: bool = Field(True, description="Require `Authorization: Bearer <api_key>`.")
    api_key: str | None = Field(
        None, description="The bearer token; None draws a random one when the gateway starts."
    )
    models: dict[str, str] = Field(
        default_factory=lambda: {"agentrl": "default"},
        description="Model names clients may ask for, each mapped to the policy serving it.",
    )
    node: str = Field("agent", description="Node name the gateway's calls are recorded under.")
    open_on_first_call: bool = Field(
        False, description="An unknown rollout id opens a rollout instead of failing with 404 "
        "(for agents started outside agentrl; training opens every rollout itself).",
    )
    start_timeout_s: float = Field(30.0, gt=0, description="Longest wait for the server to listen.")

    @model_validator(mode="after")
    def _served(self) -> GatewayConfig:
        if not self.models:
            raise ValueError("models must name at least one model the gateway serves")
        if self.auth is False and self.api_key:
            raise ValueError("api_key is set but auth is False: drop api_key or enable auth")
        return self
