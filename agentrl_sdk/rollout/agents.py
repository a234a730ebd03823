"""Rollouts of agent functions: any OpenAI-speaking agent, recorded through the gateway.

An agent function is ``agent(endpoint, row)`` (async, or sync and run in a thread): it gets an
`AgentEndpoint` whose base URL is private to the rollout, talks to it with any OpenAI client,
and may return a final state for the reward function. The gateway records its calls into the
rollout's token ledger, so the result is an ordinary `Trajectory`.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl_sdk.chat.turn import failure_status
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.gateway import Gateway, GatewayConfig
from agentrl_sdk.types import Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.chat.template import ChatTemplate
    from agentrl_sdk.engines.base import Engine

MODEL_NAME = "agentrl"
"""The model name agent functions ask for; it names the default policy."""


class AgentEndpoint(BaseModel):
    """Where an agent function sends its chat completions during one rollout."""

    model_config = ConfigDict(frozen=True)

    base_url: str = Field(description="OpenAI base URL of this rollout (ends in ``/v1``).")
    api_key: str | None = Field(description="Bearer token of the gateway (None: no auth).")
    model: str = Field(MODEL_NAME, description="Model name to request.")
    rollout_id: str = Field(description="The rollout's id at the gateway.")

    @property
    def reward_url(self) -> str:
        """Where ``POST {"value": x, "name": "..."}`` adds to a reward component."""
        return self.base_url.removesuffix("/v1") + "/reward"

    async def emit_reward(self, value: float, name: str = "reward", timeout_s: float = 30.0) -> None:
        """Add ``value`` to this rollout's reward component ``name`` (as `sdk.emit_reward`).

        Raises:
            httpx.HTTPStatusError: The gateway refused it (closed rollout, NaN value).
        """
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            reply = await client.post(self.reward_url, json={"value": value, "name": name},
                                      headers=headers)
        reply.raise_for_status()

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this rollout (needs the ``openai`` package)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "none", **kwargs)


AgentFn = Callable[[AgentEndpoint, Mapping[str, Any]], Awaitable[Any] | Any]
"""``agent(endpoint, row)`` -> final state handed to the reward function (may be None)."""


def build_gateway(
    engine: Engine | Mapping[str, Engine], template: ChatTemplate, config: RolloutConfig
) -> Gateway:
    """A gateway over the rollout engines, not yet started: ``agentrl`` names the default
    policy, and every policy is also served under its own name."""
    models = {MODEL_NAME: "default"}
    if isinstance(engine, Mapping):
        models |= {name: name for name in engine}
    return Gateway(engine, template, config=GatewayConfig(models=models), rollout=config)


async def run_agent(
    agent_fn: AgentFn,
    row: Mapping[str, Any],
    row_id: str,
    sample_index: int,
    gateway: Gateway,
    config: RolloutConfig,
    record_events: bool = False,
) -> Trajectory:
    """One rollout of ``agent_fn`` on ``row`` through ``gateway``.

    A failure the gateway saw (context budget, engine) decides the status even when the agent
    then raised because of it; an agent that raised on its own ends as ``graph_error``.
    ``record_events`` times the engine calls into ``Trajectory.events`` (for its trace).
    """
    rollout_id = uuid.uuid4().hex  # URL-safe, and never reused by a later rollout
    session = gateway.open(rollout_id, row_id=row_id, sample_index=sample_index,
                           record_events=record_events)
    endpoint = AgentEndpoint(
        base_url=gateway.rollout_url(rollout_id), api_key=gateway.api_key, rollout_id=rollout_id
    )
    state: Any = None
    try:
        state = await asyncio.wait_for(_call(agent_fn, endpoint, row), timeout=config.timeout_s)
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; it is recorded
        session.fail(*failure_status(exc, config.timeout_s))
    finally:
        trajectory = gateway.close(rollout_id)
    trajectory.final_state = state
    return trajectory


async def _call(agent_fn: AgentFn, endpoint: AgentEndpoint, row: Mapping[str, Any]) -> Any:
    if inspect.iscoroutinefunction(agent_fn) or inspect.iscoroutinefunction(
        getattr(agent_fn, "__call__", None)
    ):
        return await agent_fn(endpoint, row)
    # A synchronous agent blocks: it runs in a thread while the gateway serves on this loop.
    value = await asyncio.to_thread(agent_fn, endpoint, row)
    return await value if inspect.isawaitable(value) else value
