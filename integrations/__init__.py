"""Bridges from other systems to agentrl_sdk (built on its public API; never imported by it)."""
