"""verl interop: run agentrl_sdk LangGraph graphs inside verl's agent loop.

`GraphAgentLoop` (in ``integrations.verl.agent_loop``; imports verl) is the agent loop to
register; `VerlServerEngine` and `agent_loop_fields` need no verl and are importable anywhere.
"""

from integrations.verl.engine import VerlServerEngine
from integrations.verl.output import agent_loop_fields

__all__ = ["VerlServerEngine", "agent_loop_fields"]
