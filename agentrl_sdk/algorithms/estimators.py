"""The advantage estimators behind one registry: a batch of sequences in, one advantage per
response token out. Adding an estimator is one class and one `ESTIMATORS` entry."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

import torch
from torch import Tensor

from agentrl_sdk.algorithms.advantages import AdvantageEstimator, compute_advantages
from agentrl_sdk.algorithms.step_advantages import (
    compute_anchor_advantages,
    compute_step_advantages,
)
from agentrl_sdk.algorithms.value import compute_gae, explained_variance, masked_whiten

if TYPE_CHECKING:
    from agentrl_sdk.types import Sample


def padded(rows: Sequence[Sequence[float]]) -> Tensor:
    """``(M, T)`` float32, right-padded with 0 (T at least 1)."""
    out = torch.zeros(len(rows), max([1, *map(len, rows)]))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


@dataclass(frozen=True)
class Sequences:
    """A batch of sampled sequences as an estimator reads it: ``M`` sequences (segments or
    LLM calls) of ``N`` rollouts, the rollouts in groups that are compared."""

    rewards: Tensor  # (M,) float64, the reward of each sequence's rollout (Sample.reward)
    rollout: Tensor  # (M,) rollout of each sequence in [0, N); contiguous, in call order
    group_ids: Sequence[Hashable]  # N group keys, one per rollout
    mask: Tensor  # (M, T) nonzero at sampled tokens; 0 at observations and padding
    step_rewards: Tensor | None = None  # (M,) float64, reward earned by each call (per-call)
    anchor_ids: Sequence[Hashable] | None = None  # M anchor-state keys (GiGPO)
    values: Tensor | None = None  # (M, T) a critic's values (estimators needing values)

    @classmethod
    def of(cls, samples: Sequence[Sample], **extra: object) -> Sequences:
        """The sequences of ``samples``: a rollout is a ``(row, sample, policy)``, a group a
        ``(row, policy)``; ``extra`` sets ``step_rewards``, ``anchor_ids`` or ``values``."""
        index: dict[tuple[str, int, str], int] = {}
        rollout = [index.setdefault((s.row_id, s.sample_index, s.policy), len(index))
                   for s in samples]  # fmt: skip
        return cls(
            rewards=torch.tensor([s.reward for s in samples], dtype=torch.float64),
            rollout=torch.tensor(rollout, dtype=torch.long),
            group_ids=[(row, policy) for row, _, policy in index],
            mask=padded([s.response_mask for s in samples]),
            **extra,  # type: ignore[arg-type]
        )

    @property
    def rollout_rewards(self) -> Tensor:
        """``(N,)`` each rollout's reward (its first sequence's)."""
        first = torch.ones_like(self.rollout, dtype=torch.bool)  # (M,)
        first[1:] = self.rollout[1:] != self.rollout[:-1]
        return self.rewards[first]


class Estimate(NamedTuple):
    """An estimator's answer: ``(M, T)`` advantages (the columns past a sequence's length are
    padding), metrics, and the critic's regression targets when it read values."""

    advantages: Tensor
    metrics: dict[str, float]
    returns: Tensor | None = None


class Estimator(Protocol):
    """Turns a batch of `Sequences` into one advantage per response token."""

    needs_values: ClassVar[bool]
    """Reads a critic's values (``Sequences.values``): the job trains value models."""
    per_call: ClassVar[bool]
    """Reads one sequence per LLM call (with ``step_rewards`` and ``anchor_ids``) rather than
    one per trained segment."""

    def __call__(self, seqs: Sequences) -> Estimate:
        """The advantages of ``seqs``."""
        ...


def _broadcast(adv: Tensor, mask: Tensor) -> Tensor:
    """``(M,)`` -> ``(M, T)``: a sequence's one advantage on every response token."""
    return adv[:, None].expand(-1, mask.shape[1])


@dataclass(frozen=True)
class GroupEstimator:
    """GRPO, Dr.GRPO or RLOO over each group's rollout rewards (`compute_advantages`); every
    token of a rollout gets its rollout's advantage."""

    baseline: AdvantageEstimator = "grpo"
    needs_values: ClassVar[bool] = False
    per_call: ClassVar[bool] = False

    def __call__(self, seqs: Sequences) -> Estimate:
        """Rollout advantages, broadcast over every token of the rollout's sequences."""
        adv, metrics = compute_advantages(self.baseline, seqs.rollout_rewards, seqs.group_ids)
        return Estimate(_broadcast(adv[seqs.rollout], seqs.mask), metrics)  # (M, T)


@dataclass(frozen=True)
class StepEstimator:
    """Step-level credit: each call's discounted return against its group's rollout returns
    (`compute_step_advantages`); with ``omega``, GiGPO's anchor-state groups on top
    (`compute_anchor_advantages`)."""

    baseline: AdvantageEstimator = "grpo"
    gamma: float = 1.0
    omega: float | None = None
    needs_values: ClassVar[bool] = False
    per_call: ClassVar[bool] = True

    def __call__(self, seqs: Sequences) -> Estimate:
        """Per-call advantages, broadcast over the call's tokens."""
        if seqs.step_rewards is None:
            raise ValueError("step-level advantages need Sequences.step_rewards, one per call")
        if self.omega is None:
            adv, metrics = compute_step_advantages(
                seqs.step_rewards, seqs.rollout, seqs.group_ids, self.gamma, self.baseline
            )
        else:
            if seqs.anchor_ids is None:
                raise ValueError("GiGPO advantages need Sequences.anchor_ids, one per call")
            adv, metrics = compute_anchor_advantages(
                seqs.step_rewards, seqs.rollout, seqs.group_ids, seqs.anchor_ids,
                gamma=self.gamma, baseline=self.baseline, omega=self.omega,
            )  # fmt: skip
        return Estimate(_broadcast(adv, seqs.mask), metrics)  # (M, T)


@dataclass(frozen=True)
class GAEEstimator:
    """PPO with a critic: GAE over the sampled tokens from the critic's values (`compute_gae`),
    each sequence ending in its rollout's reward; optionally whitened over the batch.

    Metrics: ``values_mean``, ``returns_mean``, ``advantages_mean`` (before whitening, all over
    sampled tokens) and ``explained_variance`` (left out when the returns do not vary).
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True
    needs_values: ClassVar[bool] = True
    per_call: ClassVar[bool] = False

    def __call__(self, seqs: Sequences) -> Estimate:
        """Token advantages and returns; 0 at observation tokens."""
        if seqs.values is None:
            raise ValueError("gae advantages need a critic's values (Sequences.values)")
        v, mask = seqs.values, seqs.mask  # (M, T)
        adv, ret = compute_gae(seqs.rewards.float(), v, mask, self.gamma, self.lam)  # (M, T)
        keep = mask.bool()
        metrics = {name: float(x[keep].mean()) if keep.any() else 0.0
                   for name, x in (("values_mean", v), ("returns_mean", ret),
                                   ("advantages_mean", adv))}  # fmt: skip
        ev = explained_variance(v, ret, mask)
        if not math.isnan(ev):  # returns that do not vary leave nothing to explain
            metrics["explained_variance"] = ev
        return Estimate(masked_whiten(adv, mask) if self.whiten else adv, metrics, ret)


ESTIMATORS: dict[str, Callable[..., Estimator]] = {
    "grpo": partial(GroupEstimator, baseline="grpo"),
    "drgrpo": partial(GroupEstimator, baseline="drgrpo"),
    "rloo": partial(GroupEstimator, baseline="rloo"),
    "step": StepEstimator,
    "gae": GAEEstimator,
}
"""Every advantage estimator by name; the one place names map to estimators."""


def make_estimator(name: str, **options: object) -> Estimator:
    """The estimator called ``name`` with the ``options`` it takes.

    Options it does not take are left out, so a config can offer all its sections' options
    (``gamma`` of step-level credit and of GAE are never offered together).

    Raises:
        ValueError: ``name`` is not in `ESTIMATORS`.
    """
    try:
        factory = ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}"
        ) from None
    bound = factory.keywords if isinstance(factory, partial) else {}
    cls = factory.func if isinstance(factory, partial) else factory
    taken = {f.name for f in dataclasses.fields(cls)} - set(bound)  # type: ignore[arg-type]
    return factory(**{k: v for k, v in options.items() if k in taken})
