"""The recording gateway: an OpenAI-compatible server whose calls land in rollout token ledgers.

Any agent that speaks OpenAI chat completions (the OpenAI SDK, LiteLLM, CrewAI, curl) can be
rolled out and trained: each rollout gets its own base URL, and every call is recorded into the
same `TokenLedger` `TokenChatModel` writes, so the pipeline trains on ordinary `Trajectory`s.
FastAPI and uvicorn are imported only when a gateway starts (the ``gateway`` extra).
"""

from agentrl_sdk.gateway.config import GatewayConfig
from agentrl_sdk.gateway.errors import GatewayError
from agentrl_sdk.gateway.server import Gateway
from agentrl_sdk.gateway.sessions import (
    ExpiredRolloutError,
    RolloutSession,
    SessionRegistry,
    TooManyRolloutsError,
    UnknownRolloutError,
)
from agentrl_sdk.gateway.stats import GatewayStats

__all__ = [
    "ExpiredRolloutError",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "GatewayStats",
    "RolloutSession",
    "SessionRegistry",
    "TooManyRolloutsError",
    "UnknownRolloutError",
]
