"""Inference engines: the `Engine` protocol, its implementations and the replica pool.

The vLLM backends (`agentrl_sdk.engines.vllm.engine`, `agentrl_sdk.engines.vllm.server`) and
the Ray adapter (`agentrl_sdk.engines.ray`) import their optional dependencies only
when used; build them with `create_engine`.
"""

from agentrl_sdk.engines.base import Engine
from agentrl_sdk.engines.factory import create_engine
from agentrl_sdk.engines.pool import EnginePool
from agentrl_sdk.engines.torch.engine import TorchEngine

__all__ = ["Engine", "EnginePool", "TorchEngine", "create_engine"]
