"""What a job runs (`JobSpec`) and what its steps share once it is open (`Job`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl_sdk.chat.recorder import SharedEngine
from agentrl_sdk.data import RowLoader
from agentrl_sdk.engines import Engine
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.pipeline.policies import DEFAULT_POLICY, Policy
from agentrl_sdk.rollout import default_input
from agentrl_sdk.rollout.rewards import RewardFn, check_reward_fn
from agentrl_sdk.rollout.tree import check_forkable
from agentrl_sdk.target import Target
from agentrl_sdk.tracing import TrainingRun
from agentrl_sdk.trainer.critic import CriticGroup

__all__ = ["Job", "JobSpec"]


@dataclass(frozen=True)
class JobSpec:
    """What a job runs: the user's graph on rows, its reward, and the config.

    Args:
        graph: The user's `Target` (a graph, an agent function or a mapping of either by
            agent name is resolved to one).
        rows: The dataset rows (training rows, or the rows an evaluation rolls out).
        reward_fn: Scores a finished rollout; None when the graph emits its rewards itself.
        config: The whole job's configuration.
        input_fn: Turns a row into the graph's input.
        skipped_rows: Dataset rows that failed validation (reported and logged).
        eval_rows: Held-out rows that ``config.evaluation`` evaluates on.
    """

    graph: Target
    rows: list[dict[str, Any]]
    reward_fn: RewardFn | None
    config: TrainConfig
    input_fn: Callable[[dict[str, Any]], Any] = default_input
    skipped_rows: int = 0
    eval_rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "graph", Target.of(self.graph))
        check_reward_fn(self.reward_fn)
        check_forkable(self.graph, self.config.rollout.tree)


@dataclass
class Job:
    """Everything one training job's steps share."""

    graph: Target
    reward_fn: RewardFn | None
    input_fn: Callable[[dict[str, Any]], Any]
    config: TrainConfig
    tokenizer: Any
    loader: RowLoader
    policies: dict[str, Policy]
    run: TrainingRun | None = None
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    critics: dict[str, CriticGroup] = field(default_factory=dict)  # by policy (gae only)

    @property
    def trained(self) -> list[Policy]:
        return [p for p in self.policies.values() if p.group is not None]

    @property
    def engines(self) -> Mapping[str, Engine]:
        """What rollouts call, by policy name: every policy's gate (with one policy, its gate
        serves whatever policy a node names, as one engine does in ``sdk.rollout``)."""
        return self._by_policy({name: p.gate for name, p in self.policies.items()})

    @property
    def ungated_engines(self) -> Mapping[str, Engine]:
        """As `engines`, past the gates: what an evaluation calls while the gates hold the
        training rollouts back."""
        return self._by_policy({name: p.gate.engine for name, p in self.policies.items()})

    def _by_policy(self, engines: dict[str, Engine]) -> Mapping[str, Engine]:
        if len(engines) == 1:
            return SharedEngine(engines[DEFAULT_POLICY])
        return engines

    @property
    def traced(self) -> bool:
        """Whether rollouts record events for MLflow traces."""
        return self.run is not None and self.config.tracking.traces != "off"
