"""`GatewayConfig`: where the recording gateway listens, who may call it, what it serves."""

from __future__ import annotations

import ipaddress

from pydantic import Field, model_validator

from agentrl_sdk.config import ConfigSection


class ListenConfig(ConfigSection):
    """Where a server listens and what it reads: the fields `GatewayConfig` and `ServeConfig`
    share."""

    host: str = Field("127.0.0.1", description="Interface to listen on; loopback by default.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    start_timeout_s: float = Field(30.0, gt=0, description="Longest wait for the server to listen.")
    max_request_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest request body; a larger one answers 413 "
        "before it is parsed (by Content-Length, or while a chunked body is read).",
    )
    allow_unauthenticated_remote: bool = Field(
        False, description="Serve a non-loopback host without auth (anyone who reaches the port "
        "can use the server); refused unless set.",
    )


class GatewayConfig(ListenConfig):
    """How the recording gateway is served."""

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
    max_client_rollouts: int = Field(
        256, ge=1, description="Most rollouts clients may hold open at once (opened by POST "
        "/rollouts or by a first call under open_on_first_call); past it, opening one answers "
        "429 `too_many_rollouts`. Rollouts the pipeline opens in-process are not counted.",
    )
    client_rollout_ttl_s: float = Field(
        600.0, gt=0, description="A client rollout that gets no request for this long is "
        "dropped (counted in /health); its id then answers 404 `rollout_expired`.",
    )

    @model_validator(mode="after")
    def _served(self) -> GatewayConfig:
        if not self.models:
            raise ValueError("models must name at least one model the gateway serves")
        if self.auth is False and self.api_key:
            raise ValueError("api_key is set but auth is False: drop api_key or enable auth")
        if self.open_to_anyone and not self.allow_unauthenticated_remote:
            raise ValueError(
                f"host {self.host!r} is not a loopback address and auth is False: anyone who "
                "can reach the port could use the engine and read rollouts. Keep auth on, bind "
                "127.0.0.1, or set allow_unauthenticated_remote (agentrl gateway "
                "--i-know-its-open)"
            )
        return self

    @property
    def open_to_anyone(self) -> bool:
        """Served beyond this machine without auth (only allow_unauthenticated_remote allows it)."""
        return not self.auth and not is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False
