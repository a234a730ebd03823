"""Graph side of rollouts: node decorators and tool nodes for RL."""

from agentrl_sdk.graph.model import chat_model
from agentrl_sdk.graph.nodes import frozen, trainable
from agentrl_sdk.graph.rewards import emit_reward
from agentrl_sdk.graph.tools import ToolNode, tools_condition

__all__ = ["ToolNode", "chat_model", "emit_reward", "frozen", "tools_condition", "trainable"]
