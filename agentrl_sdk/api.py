"""`sdk.train`: wire a graph, a dataset, a reward and a config into a training pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl_sdk.data import DatasetLike, load_rows
from agentrl_sdk.pipeline import TrainConfig, TrainResult, run_fully_async, run_sync
from agentrl_sdk.rollout import default_input
from agentrl_sdk.rollout.rewards import RewardFn

ConfigLike = TrainConfig | Mapping[str, Any] | str | Path | None


def resolve_config(config: ConfigLike, **overrides: Any) -> TrainConfig:
    """A `TrainConfig` from an object, a dict or a YAML path, with top-level overrides."""
    if config is None:
        resolved = TrainConfig()
    elif isinstance(config, TrainConfig):
        resolved = config
    elif isinstance(config, Mapping):
        resolved = TrainConfig.model_validate(config)
    else:
        resolved = TrainConfig.from_yaml(config)
    if overrides:
        resolved = TrainConfig.model_validate({**resolved.model_dump(), **overrides})
    return resolved


async def atrain(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
) -> TrainResult:
    """Async `train`, for callers that already run an event loop."""
    resolved = resolve_config(config)
    agents = set(graph) if isinstance(graph, Mapping) else None
    rows, problems = load_rows(dataset, on_bad_row=resolved.data.on_bad_row, agent_names=agents)
    pipeline = run_fully_async if resolved.pipeline == "fully_async" else run_sync
    return await pipeline(graph, rows, reward, resolved, input_fn=input_fn,
                          skipped_rows=len(problems))


def train(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
) -> TrainResult:
    """Train the trainable nodes of ``graph`` with RL on ``dataset``.

    Runs rollouts of the graph on every row (``rollout.n`` samples each), token-exact
    trajectories, rewards, group advantages, a policy update on the trainer workers, weight
    sync to the engine, MLflow metrics and checkpoints — ``max_steps`` times.

    Args:
        graph: A compiled LangGraph graph; or an agent function ``agent(endpoint, row)``
            (async, or sync and run in a thread) that sends OpenAI chat completions to
            ``endpoint.base_url`` with ``endpoint.api_key``: its calls are recorded by the
            gateway (see `AgentEndpoint`); or ``{agent_name: graph_or_agent}``: each row then
            runs the one its ``agent_name`` names (``"default"`` when it has none).
        dataset: Dict rows, a JSONL/parquet path, or a HF ``Dataset``; verl-format rows
            (``prompt``, ``reward_model``, ``extra_info.tools_kwargs``...) are validated and a
            bad one is reported by index and field, then skipped (``data.on_bad_row``).
        reward: ``reward(final_state, row, trajectory)`` -> float or named components (an
            agent function's return value is its ``final_state``; rewards it posts to the
            gateway's ``/rollouts/<id>/reward`` add up with it).
        config: A `TrainConfig`, a dict, or a YAML path.
        input_fn: Row -> graph input (default: the row's ``messages``/``prompt``).
    """
    return asyncio.run(atrain(graph, dataset, reward, config, input_fn=input_fn))
