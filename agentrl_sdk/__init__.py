"""agentrl_sdk: train LLM agents written as LangGraph graphs with reinforcement learning."""

from agentrl_sdk import _moved

_moved.install()  # former module paths keep importing (see `agentrl_sdk._moved`)

from agentrl_sdk import environments, rewards
from agentrl_sdk.api import (
    aevaluate,
    atrain,
    evaluate,
    finetune_on_traces,
    train,
    train_on_traces,
)
from agentrl_sdk.chat import ChatTemplate, TokenChatModel
from agentrl_sdk.config import ChatConfig, NodeRule, RolloutConfig
from agentrl_sdk.errors import (
    AgentRLError,
    ContextBudgetExceeded,
    EngineError,
    NoEngineError,
    TraceMismatchError,
)
from agentrl_sdk.graph import (
    ToolNode,
    chat_model,
    emit_reward,
    frozen,
    tools_condition,
    trainable,
)
from agentrl_sdk.pipeline import EvalConfig, EvalResult, TrainConfig, TrainResult
from agentrl_sdk.pipeline.offline import OfflineResult
from agentrl_sdk.production import TraceRecord, TraceSelection, traces
from agentrl_sdk.production.finetune import FinetuneResult
from agentrl_sdk.rollout import AgentEndpoint, arollout, arollout_batch, rollout
from agentrl_sdk.serving import GraphServer, ServeConfig, aserve, serve
from agentrl_sdk.tools import RLTool
from agentrl_sdk.types import (
    GenerateResult,
    LLMCall,
    RewardComponent,
    SamplingParams,
    Segment,
    Trajectory,
)

__version__ = "0.1.0"

__all__ = [
    "AgentEndpoint",
    "AgentRLError",
    "ChatConfig",
    "ChatTemplate",
    "ContextBudgetExceeded",
    "EngineError",
    "EvalConfig",
    "EvalResult",
    "FinetuneResult",
    "GenerateResult",
    "GraphServer",
    "LLMCall",
    "NoEngineError",
    "NodeRule",
    "OfflineResult",
    "RLTool",
    "RewardComponent",
    "RolloutConfig",
    "SamplingParams",
    "ServeConfig",
    "Segment",
    "TokenChatModel",
    "TrainConfig",
    "TrainResult",
    "ToolNode",
    "TraceMismatchError",
    "TraceRecord",
    "TraceSelection",
    "Trajectory",
    "__version__",
    "aevaluate",
    "arollout",
    "arollout_batch",
    "aserve",
    "atrain",
    "chat_model",
    "emit_reward",
    "environments",
    "evaluate",
    "finetune_on_traces",
    "frozen",
    "rewards",
    "rollout",
    "serve",
    "tools_condition",
    "traces",
    "train",
    "train_on_traces",
    "trainable",
]
