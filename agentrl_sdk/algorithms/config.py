"""`AlgorithmConfig`: the ``algorithm`` section of a training config: the policy loss, the
advantage estimator and how rewards become its batch (dynamic sampling, over-long handling,
step-level credit)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, model_validator

from agentrl_sdk.algorithms.advantages import AdvantageEstimator
from agentrl_sdk.algorithms.estimators import Estimator, GAEEstimator, make_estimator
from agentrl_sdk.algorithms.losses import PolicyLossConfig
from agentrl_sdk.config import ConfigSection

__all__ = ["AlgorithmConfig", "DynamicSamplingConfig", "OverlongConfig", "StepLevelConfig"]


class DynamicSamplingConfig(ConfigSection):
    """DAPO's dynamic sampling: train only on groups whose rewards differ."""

    enabled: bool = Field(
        False, description="Drop (row, policy) groups whose rewards all agree (their advantages "
        "are all zero), counted as groups_dropped_no_signal, and sample more rows until "
        "data.batch_size rows with signal are in the batch. Signal is judged on each policy's "
        "rollout rewards (with step_level too)."
    )
    max_extra_rounds: int = Field(
        4, ge=0, description="An update passes over at most this many batches' worth of "
        "groups without signal (each frees its slot for another row), then trains on the "
        "groups with signal it has; the same in both pipelines. 0: groups without signal are "
        "left out, and no more rows are sampled."
    )


class OverlongConfig(ConfigSection):
    """DAPO's over-long handling of responses that reach their token budget."""

    drop_truncated: bool = Field(
        False, description="Leave out of training rollouts whose last LLM call ended with "
        "finish_reason length (counted as rollouts_dropped_truncated)."
    )
    buffer: int = Field(
        0, ge=0, description="Soft penalty: a response within the last `buffer` tokens before "
        "rollout.sampling.max_tokens loses up to `penalty` linearly (reward component "
        "'overlong', crediting the call's node and step); 0 is off."
    )
    penalty: float = Field(1.0, ge=0.0, description="The soft penalty at max_tokens.")


class StepLevelConfig(ConfigSection):
    """Step-level credit: each LLM call its own sample and advantage."""

    enabled: bool = Field(
        False, description="Advantages per LLM call from discounted returns over the policy's "
        "calls in the rollout (rewards emitted with step= credit one call; the rest of the "
        "policy's reward comes at its last call), baselined per (row, policy) group as "
        "advantage_estimator says. Each call is trained as its own sequence."
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per LLM call.")
    anchor_weight: float | None = Field(
        None, ge=0.0, description="GiGPO: a call's advantage is its rollout's group advantage "
        "plus this weight times its return's advantage among the calls (of the same row and "
        "policy) that start from the same anchor state: the same node seeing the same new "
        "tokens (tool results), or the same whole prompt. None: returns against the group."
    )

    @model_validator(mode="after")
    def _anchors_are_step_level(self) -> StepLevelConfig:
        if self.anchor_weight is not None and not self.enabled:
            raise ValueError("algorithm.step_level.anchor_weight needs "
                             "algorithm.step_level.enabled: true")
        return self


class AlgorithmConfig(PolicyLossConfig):
    """The policy loss (`PolicyLossConfig`) and how rewards become its batch: the weight of
    the shared outcome, dynamic sampling, over-long handling and step-level credit."""

    outcome_reward_weight: float = Field(
        1.0, description="Weight of the shared outcome (the reward function's value and rewards "
        "crediting no node) in each policy's reward; components crediting a policy's nodes "
        "count in full. 0: each policy learns from its own credit only."
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig, description="DAPO's dynamic sampling: train "
        "only on groups whose rewards differ."
    )
    overlong: OverlongConfig = Field(
        default_factory=OverlongConfig, description="DAPO's handling of responses that reach "
        "their token budget: leave them out, or a soft length penalty."
    )
    step_level: StepLevelConfig = Field(
        default_factory=StepLevelConfig, description="Step-level credit: each LLM call its own "
        "sample and advantage (GiGPO with anchor_weight)."
    )
    gae: GAEEstimator = Field(
        default_factory=GAEEstimator, description="Options of advantage_estimator: gae (PPO "
        "with the critic's values); set with another estimator, they are refused."
    )
    tree_levels: Literal["tree", "branch"] = Field(
        "tree", description="advantage_estimator tree: baseline a leaf within its tree (tree), "
        "or also within the leaves under each deeper branch point it passed (branch); branch "
        "with another estimator is refused."
    )

    _OPTIONS_OF: ClassVar[dict[str, str]] = {"gae": "gae", "tree_levels": "tree"}
    """The fields holding one estimator's options, with that estimator's name: only it reads
    them."""

    @model_validator(mode="after")
    def _estimator_and_its_options(self) -> AlgorithmConfig:
        baselines = get_args(AdvantageEstimator)
        if self.step_level.enabled and self.advantage_estimator not in baselines:
            raise ValueError(f"algorithm.step_level needs algorithm.advantage_estimator in "
                             f"{baselines}, not {self.advantage_estimator!r}")
        # A value other than the default is taken as set by the user: a set-fields check
        # would refuse a dumped and reloaded config, whose every field is set.
        for field, owner in self._OPTIONS_OF.items():
            default = type(self).model_fields[field].get_default(call_default_factory=True)
            if owner != self._chosen and getattr(self, field) != default:
                chosen = (f"step-level credit over {self.advantage_estimator!r}"
                          if self.step_level.enabled else repr(self.advantage_estimator))
                raise ValueError(
                    f"algorithm.{field} holds options of advantage_estimator {owner!r} alone, "
                    f"but the estimator chosen is {chosen}: leave {field} unset or choose "
                    f"advantage_estimator: {owner}"
                )
        return self

    @property
    def _chosen(self) -> str:
        """The name of the estimator in use (``step`` with ``step_level``)."""
        return "step" if self.step_level.enabled else self.advantage_estimator

    @property
    def estimator(self) -> Estimator:
        """The advantage estimator: step-level credit over the ``advantage_estimator`` baseline
        when ``step_level`` is enabled, else ``advantage_estimator`` with its own options (the
        ``gae`` section, ``tree_levels``) and no other's."""
        step = self.step_level
        options: dict[str, dict[str, Any]] = {  # of each estimator that takes some
            "step": {"baseline": self.advantage_estimator, "gamma": step.gamma,
                     "omega": step.anchor_weight},
            "tree": {"levels": self.tree_levels},
            "gae": self.gae.model_dump(),
        }  # fmt: skip
        return make_estimator(self._chosen, **options.get(self._chosen, {}))

    @property
    def loss(self) -> PolicyLossConfig:
        """The loss options alone: what the trainer workers get (they import no pipeline)."""
        return PolicyLossConfig(**self.model_dump(include=set(PolicyLossConfig.model_fields)))
