"""The examples' safe arithmetic evaluator: the SDK's own, which parses with `ast` and allows
numbers and + - * / // % ** only (`agentrl_sdk.environments.calculator`)."""

from agentrl_sdk.environments.calculator import calculate

__all__ = ["calculate"]
