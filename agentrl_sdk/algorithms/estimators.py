"""The advantage estimators behind one registry: a batch of sequences in, one advantage per
response token out. Adding an estimator is one class and one `ESTIMATORS` entry."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol, get_args

import torch
from pydantic import Field
from torch import Tensor

from agentrl_sdk.algorithms.advantages import (
    AdvantageEstimator,
    GroupIds,
    _baseline,
    _group,
    _std,
    compute_grpo_advantages,
    compute_rloo_advantages,
)
from agentrl_sdk.algorithms.value import compute_gae, explained_variance, masked_whiten
from agentrl_sdk.config import ConfigSection

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
    tree_paths: Sequence[tuple[int, ...]] | None = None  # N: (tree, child at each branch point)
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
    def first(self) -> Tensor:
        """``(M,)`` True at each rollout's first sequence."""
        first = torch.ones_like(self.rollout, dtype=torch.bool)
        first[1:] = self.rollout[1:] != self.rollout[:-1]
        return first


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
    """Reads one sequence per LLM call (``step_rewards``, ``anchor_ids``), not per segment."""

    def __call__(self, seqs: Sequences) -> Estimate:
        """The advantages of ``seqs``."""
        ...


class GroupEstimator(ConfigSection, frozen=True):
    """GRPO, Dr.GRPO (no std division) or RLOO over each group's rollout rewards, each token
    with its rollout's advantage (`compute_grpo_advantages`, `compute_rloo_advantages`)."""

    baseline: AdvantageEstimator = "grpo"
    needs_values: ClassVar[bool] = False
    per_call: ClassVar[bool] = False

    def rollout_advantages(self, rewards: Tensor, group_ids: GroupIds) -> tuple[Tensor, dict]:
        """``(N,)`` advantages of one reward per rollout, and their metrics."""
        if self.baseline == "rloo":
            return compute_rloo_advantages(rewards, group_ids)
        return compute_grpo_advantages(rewards, group_ids, norm_by_std=self.baseline == "grpo")

    def __call__(self, seqs: Sequences) -> Estimate:
        """Rollout advantages, broadcast over every token of the rollout's sequences."""
        adv, metrics = self.rollout_advantages(seqs.rewards[seqs.first], seqs.group_ids)
        return Estimate(adv[seqs.rollout][:, None].expand(seqs.mask.shape), metrics)  # (M, T)


def discounted_returns(rewards: Tensor, rollout: Tensor, gamma: float) -> Tensor:
    """``(M,)`` ``G_k = r_k + gamma * G_{k+1}`` within each rollout (0 after its last call),
    for ``(M,)`` call ``rewards`` and ``rollout`` as in `Sequences`."""
    returns = torch.empty_like(rewards)  # (M,)
    for k in range(rewards.numel() - 1, -1, -1):
        if k == rewards.numel() - 1 or rollout[k + 1] != rollout[k]:
            running = rewards.new_zeros(())  # the rollout's last call
        running = rewards[k] + gamma * running
        returns[k] = running
    return returns


class StepEstimator(ConfigSection, frozen=True):
    """Step-level credit: each LLM call's discounted return ``G_k`` (`discounted_returns` of
    ``step_rewards``, a rollout's outcome on its last call) against its group.

    ``omega`` None: ``adv_k = (G_k - b_i) / s_i`` for call ``k`` of rollout ``i``, with
    ``G_i = G_{first call of i}`` the rollout's return, ``b_i`` the mean of ``G`` over the
    rollouts of ``i``'s group (``grpo``, ``drgrpo``) or over the others (``rloo``), ``s_i`` the
    group's unbiased std of ``G`` plus ``eps`` for ``grpo`` (1 when that std is 0, so rewards
    earned by single calls still count), else 1; groups of one rollout get 0. With ``gamma = 1``
    and only a last-call reward these are the rollout-level advantages (to rounding).
    Metrics: ``step_adv_mean``, ``step_adv_std``, ``step_return_mean``.

    ``omega`` set, GiGPO (Feng et al., arXiv:2505.10978): ``adv_k = A_E(i) + omega * A_S(k)``,
    ``A_E`` the ``baseline`` group estimator over the rollouts' total rewards, ``A_S`` the same
    over the calls' returns within the step group of calls that share their rollout's group
    and their anchor state (``anchor_ids``); a step group of one call adds nothing.
    Metrics: ``step_adv_mean``, ``step_adv_std``, ``step_groups``, ``step_group_size_mean``.
    """

    baseline: AdvantageEstimator = "grpo"
    gamma: float = 1.0
    omega: float | None = None
    eps: float = 1e-6
    needs_values: ClassVar[bool] = False
    per_call: ClassVar[bool] = True

    def __call__(self, seqs: Sequences) -> Estimate:
        """Per-call advantages, broadcast over the call's tokens."""
        if seqs.step_rewards is None or (self.omega is not None and seqs.anchor_ids is None):
            raise ValueError("step-level advantages need Sequences.step_rewards (and "
                             "anchor_ids, with omega), one per call")
        r = seqs.step_rewards.to(torch.float64)  # (M,)
        returns = discounted_returns(r, seqs.rollout, self.gamma)  # (M,)
        if self.omega is None:
            adv = self._against_group(returns, seqs)
            extra = {"step_return_mean": returns.mean().item() if returns.numel() else 0.0}
        else:
            adv, extra = self._anchored(r, returns, seqs)
        metrics = {
            "step_adv_mean": adv.mean().item() if adv.numel() else 0.0,
            "step_adv_std": adv.std(correction=0).item() if adv.numel() else 0.0,
            **extra,
        }
        return Estimate(adv[:, None].expand(seqs.mask.shape), metrics)  # (M, T)

    def _against_group(self, returns: Tensor, seqs: Sequences) -> Tensor:
        g = _group(returns[seqs.first], seqs.group_ids)  # per rollout (N,)
        base = _baseline(g, leave_one_out=self.baseline == "rloo")  # (N,)
        scale = torch.ones_like(base)  # (N,)
        if self.baseline == "grpo":
            std = _std(g, g.r - base)[g.index]  # (N,)
            scale = torch.where(std > 0, std + self.eps, scale)
        adv = (returns - base[seqs.rollout]) / scale[seqs.rollout]  # (M,)
        return torch.where(g.count[g.index][seqs.rollout] > 1, adv, torch.zeros_like(adv))

    def _anchored(self, r: Tensor, returns: Tensor, seqs: Sequences) -> tuple[Tensor, dict]:
        group = GroupEstimator(baseline=self.baseline)
        rollout, group_ids = seqs.rollout, seqs.group_ids
        totals = r.new_zeros(len(group_ids)).index_add(0, rollout, r)  # (N,)
        episode, _ = group.rollout_advantages(totals, group_ids)  # (N,)
        step_keys = [(group_ids[i], a)
                     for i, a in zip(rollout.tolist(), seqs.anchor_ids or (), strict=True)]
        step, step_metrics = group.rollout_advantages(returns, step_keys)  # (M,)
        groups = step_metrics["adv_groups"]
        return episode[rollout] + self.omega * step, {  # type: ignore[operator]
            "step_groups": groups,
            "step_group_size_mean": returns.numel() / groups if groups else 0.0,
        }


class GAEEstimator(ConfigSection):
    """PPO with a critic: GAE over the sampled tokens from the critic's values (`compute_gae`),
    each sequence ending in its rollout's reward; optionally whitened over the batch. Its
    options are the config's ``algorithm.gae`` section.

    Metrics: ``values_mean``, ``returns_mean``, ``advantages_mean`` (before whitening, all over
    sampled tokens) and ``explained_variance`` (left out when the returns do not vary).
    """

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per sampled token.")
    lam: float = Field(
        1.0, ge=0.0, le=1.0, description="GAE lambda: 1 is the Monte-Carlo return minus the "
        "value, 0 one-step TD. Observation tokens (tool results) take no step either way."
    )
    whiten: bool = Field(
        True, description="Standardise each policy's token advantages over the batch (as "
        "verl's GAE); the critic's returns are not changed."
    )
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


class TreeEstimator(ConfigSection, frozen=True):
    """Tree-GRPO (Ji et al., arXiv:2509.21240) for rollouts forked from shared prefixes.

    A group's rollouts are the leaves of trees; ``Sequences.tree_paths`` gives each leaf its
    tree and the child it took at each branch point, ``(tree, c_1, c_2, ...)``. A leaf's
    advantage is the ``baseline`` estimator's over every leaf of its group (inter-tree) plus
    the same over the leaves of its tree (intra-tree); with ``levels: branch``, also over the
    leaves under each deeper branch point it passed (the leaves sharing ``path[:d]``). A set of
    one leaf, or of equal rewards, adds 0, so chain rollouts (no paths) get the plain group
    advantage. It is put on every token of the leaf's sequences: a prefix several leaves share
    is trained with the sum of theirs, which is where each step's own credit comes from (a
    branch whose leaves beat their siblings' raises the step that chose it).
    """

    baseline: AdvantageEstimator = "grpo"
    levels: Literal["tree", "branch"] = "tree"
    needs_values: ClassVar[bool] = False
    per_call: ClassVar[bool] = False

    def __call__(self, seqs: Sequences) -> Estimate:
        """Leaf advantages, broadcast over every token of the leaf's sequences."""
        group = GroupEstimator(baseline=self.baseline)
        rewards, group_ids = seqs.rewards[seqs.first], seqs.group_ids  # (N,), N
        adv, metrics = group.rollout_advantages(rewards, group_ids)  # inter-tree
        paths = seqs.tree_paths or [(i,) for i in range(len(group_ids))]
        if len(paths) != len(group_ids):
            raise ValueError(f"tree_paths has {len(paths)} entries for {len(group_ids)} rollouts")
        depth = max(map(len, paths), default=1) - 1 if self.levels == "branch" else 1
        intra = torch.zeros_like(adv)  # (N,)
        for d in range(1, depth + 1):
            # The leaves under the d-th branch point (d = 1: the tree); paths are unique, so a
            # leaf that ended above that depth is alone.
            keys = [(g, p[:d]) for g, p in zip(group_ids, paths, strict=True)]
            intra += group.rollout_advantages(rewards, keys)[0]
        adv = adv + intra
        metrics = {**metrics, "tree_intra_adv_std": intra.std(correction=0).item()
                   if intra.numel() else 0.0}  # fmt: skip
        return Estimate(adv[seqs.rollout][:, None].expand(seqs.mask.shape), metrics)  # (M, T)


ESTIMATORS: dict[str, Callable[..., Estimator]] = {
    **{baseline: partial(GroupEstimator, baseline=baseline)
       for baseline in get_args(AdvantageEstimator)},
    "step": StepEstimator,
    "tree": TreeEstimator,
    "gae": GAEEstimator,
}  # fmt: skip
"""Every advantage estimator by name; the one place names map to estimators."""


def _model(factory: Callable[..., Estimator]) -> Any:
    """The estimator class an `ESTIMATORS` entry builds (a partial's function)."""
    return getattr(factory, "func", factory)


EstimatorName = Literal[  # type: ignore[valid-type]
    tuple(name for name, factory in ESTIMATORS.items() if not _model(factory).per_call)
]
"""Every ``algorithm.advantage_estimator``, from `ESTIMATORS`: the group baselines, ``tree``
(Tree-GRPO, for ``rollout.tree``) and ``gae`` (PPO with a critic). A per-call estimator
(``step``) is not among them: ``algorithm.step_level`` chooses it, over one of the baselines."""


def estimator_options(name: str) -> tuple[str, ...]:
    """The options `make_estimator` takes for ``name``: its model's fields, less those its
    `ESTIMATORS` entry fixes (``grpo`` is `GroupEstimator` with its ``baseline`` set).

    Raises:
        ValueError: ``name`` is not in `ESTIMATORS`, naming the ones that are.
    """
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of "
                         f"{sorted(ESTIMATORS)}")
    factory = ESTIMATORS[name]
    fixed = getattr(factory, "keywords", {})
    return tuple(field for field in _model(factory).model_fields if field not in fixed)


def make_estimator(name: str, **options: object) -> Estimator:
    """The estimator called ``name`` with ``options``.

    Raises:
        ValueError: ``name`` is not in `ESTIMATORS`, an option is not one it takes (naming
            the ones it does, `estimator_options`), or an option is out of range.
    """
    accepted = estimator_options(name)
    # Refused rather than dropped: an option meant for another estimator would otherwise
    # change nothing without a word.
    if unknown := [option for option in options if option not in accepted]:
        raise ValueError(f"advantage estimator {name!r} takes no option "
                         f"{', '.join(map(repr, unknown))}; its options: "
                         f"{', '.join(accepted) if accepted else 'none'}")
    return ESTIMATORS[name](**options)
