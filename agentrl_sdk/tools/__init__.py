"""Tools for RL rollouts: verl's per-rollout tool lifecycle on top of LangChain tools."""

from agentrl_sdk.tools.lifecycle import (
    RLTool,
    ToolNotForkable,
    ToolSession,
    current_tool_session,
    tools_kwargs_of,
)

__all__ = ["RLTool", "ToolNotForkable", "ToolSession", "current_tool_session", "tools_kwargs_of"]
