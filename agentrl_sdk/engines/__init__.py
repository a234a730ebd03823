"""Inference engines: the `Engine` protocol and its implementations."""

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.engines.factory import create_engine
from agentrl_sdk.engines.torch_engine import TorchEngine

__all__ = ["Engine", "TorchEngine", "create_engine"]
