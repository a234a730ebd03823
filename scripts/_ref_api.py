"""docs/reference/api.md: mkdocstrings entries for the public API, grouped.

Every name of ``agentrl_sdk.__all__`` must sit in a group (`render` refuses otherwise), so a new
export cannot be left out of the page; the submodule objects users import come after them.
"""

from __future__ import annotations

from types import ModuleType

# (title, summary, names of agentrl_sdk.__all__, dotted paths of submodule objects)
GROUPS: list[tuple[str, str, list[str], list[str]]] = [
    ("Training and evaluation",
     "Train a graph on a dataset, or evaluate it on held-out rows.",
     ["train", "atrain", "evaluate", "aevaluate", "TrainResult", "EvalResult"], []),
    ("Graph",
     "Decorators and nodes that mark what trains inside a LangGraph graph, and reward helpers.",
     ["trainable", "frozen", "chat_model", "emit_reward", "ToolNode", "tools_condition",
      "RLTool", "rewards"],
     ["agentrl_sdk.tools.mcp.load_mcp_tools"]),
    ("Chat model",
     "The LangChain chat model that records every call token by token.",
     ["TokenChatModel", "ChatTemplate"], []),
    ("Rollouts",
     "Run a compiled graph (or an agent behind an endpoint) and get its trajectories.",
     ["rollout", "arollout", "arollout_batch", "AgentEndpoint"], []),
    ("Types",
     "What rollouts produce and engines return.",
     ["Trajectory", "Segment", "LLMCall", "RewardComponent", "GenerateResult",
      "SamplingParams"], []),
    ("Configuration",
     "The config models; [Configuration](config.md) lists every key.",
     ["TrainConfig", "EvalConfig", "RolloutConfig", "ChatConfig", "NodeRule"],
     ["agentrl_sdk.pipeline.config.ModelConfig", "agentrl_sdk.pipeline.config.PolicyConfig",
      "agentrl_sdk.engines.config.EngineConfig", "agentrl_sdk.algorithms.config.AlgorithmConfig",
      "agentrl_sdk.trainer.config.TrainerConfig", "agentrl_sdk.trainer.config.LoraConfig",
      "agentrl_sdk.trainer.config.CriticConfig", "agentrl_sdk.pipeline.config.DataConfig",
      "agentrl_sdk.pipeline.config.CheckpointConfig",
      "agentrl_sdk.tracing.config.TrackingConfig", "agentrl_sdk.pipeline.config.AsyncConfig",
      "agentrl_sdk.gateway.config.GatewayConfig"]),
    ("Environments",
     "reasoning-gym tasks and textarena games as graphs, rows and rewards "
     "(the `environments` extra).",
     ["environments"],
     ["agentrl_sdk.environments.reasoning_gym", "agentrl_sdk.environments.ReasoningGym",
      "agentrl_sdk.environments.ReasoningGymReward", "agentrl_sdk.environments.task_names",
      "agentrl_sdk.environments.textarena", "agentrl_sdk.environments.TextArenaGame",
      "agentrl_sdk.environments.GameDataMissing"]),
    ("Learning from production traces",
     "MLflow traces and their feedback as training data: exact token samples, off-policy RL "
     "on them, fine-tuning on the best, or replayed prompts ([guide](../guides/production-traces.md)).",
     ["traces", "TraceSelection", "TraceRecord", "train_on_traces", "OfflineResult",
      "finetune_on_traces", "FinetuneResult"],
     ["agentrl_sdk.production.TracedCall", "agentrl_sdk.identity.TokenizerIdentity",
      "agentrl_sdk.production.redact_text", "agentrl_sdk.production.drop_matching",
      "agentrl_sdk.production.replay_row", "agentrl_sdk.production.rollout_reward",
      "agentrl_sdk.production.training_samples",
      "agentrl_sdk.production.check_tokenizer"]),
    ("Serving",
     "A graph served over HTTP, one MLflow trace per request "
     "([guide](../guides/production-traces.md#serving-a-graph-that-records)).",
     ["serve", "aserve", "GraphServer", "ServeConfig"],
     ["agentrl_sdk.serving.Served", "agentrl_sdk.serving.ServedTraces"]),
    ("Engines, models and the gateway",
     "Inference engines, local model folders and the OpenAI-compatible recording gateway.",
     [],
     ["agentrl_sdk.engines.Engine", "agentrl_sdk.weights.WeightIntake",
      "agentrl_sdk.weights.StateDict", "agentrl_sdk.engines.create_engine",
      "agentrl_sdk.engines.TorchEngine", "agentrl_sdk.engines.EnginePool",
      "agentrl_sdk.models.smollm2_path", "agentrl_sdk.models.import_model",
      "agentrl_sdk.gateway.Gateway"]),
    ("Errors",
     "Exceptions the SDK raises on purpose.",
     ["AgentRLError", "ContextBudgetExceeded", "EngineError", "NoEngineError",
      "TraceMismatchError"],
     ["agentrl_sdk.data.DatasetError"]),
]

# Exports with no docstring of their own to render.
PLAIN = {"__version__": "`agentrl_sdk.__version__`: the package version string."}

INTRO = """\
# Python API

`import agentrl_sdk as sdk`: the names of each group's first entries are the package's exports
(`sdk.train`, `sdk.Trajectory`, ...); the entries after them are imported from the submodule
their path names. Generated from the docstrings; `python scripts/gen_reference.py` writes the
list of entries.
"""


def render(package: ModuleType) -> str:
    """The page; raises if an export of ``package`` is in no group."""
    grouped = {name for _, _, names, _ in GROUPS for name in names} | set(PLAIN)
    missing = sorted(set(package.__all__) - grouped)
    unknown = sorted(grouped - set(package.__all__))
    if missing or unknown:
        raise ValueError(f"scripts/_ref_api.py GROUPS: exports in no group {missing}, "
                         f"names that are no export {unknown}")
    lines = [INTRO]
    for title, summary, names, paths in GROUPS:
        lines += [f"## {title}", "", summary, ""]
        for dotted in [f"{package.__name__}.{n}" for n in names] + paths:
            # Under the group's "##" heading, each object's own heading is a level below.
            lines += [f"::: {dotted}", "    options:", "      heading_level: 3", ""]
    lines += ["## Version", "", *PLAIN.values(), ""]
    return "\n".join(lines).rstrip() + "\n"
