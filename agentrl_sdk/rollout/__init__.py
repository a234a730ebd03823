"""Concurrent rollouts of a graph (or an OpenAI-speaking agent function) over dataset rows."""

from agentrl_sdk.rollout.agents import AgentEndpoint, AgentFn
from agentrl_sdk.rollout.runner import (
    arollout,
    arollout_batch,
    default_input,
    rollout,
    row_id_of,
)
from agentrl_sdk.target import is_agent_fn

__all__ = [
    "AgentEndpoint",
    "AgentFn",
    "is_agent_fn",
    "arollout",
    "arollout_batch",
    "default_input",
    "rollout",
    "row_id_of",
]
