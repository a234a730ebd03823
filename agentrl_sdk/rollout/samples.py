"""Trajectories -> training samples: sequences cut as the estimator reads them (trained
segments, or LLM calls), each policy's credited reward, token advantages, per-rollout weights.

A step-level (``per_call``) estimator gives the calls of one segment different advantages, so
each trained call becomes its own sample: the exact prompt the engine saw and the exact tokens
it sampled (their logprobs and policy versions sliced from the segment). A rollout's calls share
its weight, as its segments do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl_sdk.algorithms import Estimator, Sequences, make_estimator
from agentrl_sdk.rollout.credit import PolicyCredit, trainable_credits
from agentrl_sdk.types import LLMCall, Sample, Trajectory


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    estimator: Estimator = make_estimator("grpo"),  # noqa: B008 (frozen)
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_flat_groups: bool = False,
) -> tuple[list[Sample], dict[str, float]]:
    """One sample per trained segment (or per trained LLM call, for a ``per_call`` estimator)
    of every scored trajectory, with the estimator's token advantages.

    Each policy's reward for a rollout is what `policy_reward` credits it: the components
    crediting its nodes plus ``outcome_weight`` times the shared outcome. Groups are the
    rollouts of the same dataset row and policy; every sample of a rollout gets a ``weight``
    of ``1 / (its trained segments or calls for that policy)``, so each rollout counts once.
    An estimator that ``needs_values`` leaves every advantage 0 for `with_advantages` to
    replace once a critic has scored the samples.

    Args:
        trajectories: Rollouts with ``reward`` set; those with ``reward`` None are skipped.
        estimator: From `agentrl_sdk.algorithms.make_estimator`.
        policies: Policies to build samples for; all when None.
        outcome_weight: Weight of the shared outcome in every policy's reward.
        drop_flat_groups: Leave out groups whose rewards all agree (dynamic sampling).

    Returns:
        The samples and metrics (``samples``, ``rollouts_skipped``,
        ``groups_dropped_no_signal``, the estimator's statistics).
    """
    credits, counts = trainable_credits(
        trajectories, policies=policies, outcome_weight=outcome_weight,
        drop_flat_groups=drop_flat_groups,
    )  # fmt: skip
    samples, extra = call_samples(credits) if estimator.per_call else _segment_samples(credits)
    extra |= tree_paths(credits, samples)
    if not samples:
        return [], {"samples": 0.0, **counts}
    metrics: dict[str, float] = {}
    if not estimator.needs_values:  # else the critic's values come first (score_values)
        estimate = estimator(Sequences.of(samples, **extra))
        samples, metrics = with_advantages(samples, estimate.advantages), estimate.metrics
    # A call that sampled nothing was there only for its reward: nothing to train.
    samples = [s for s in samples if s.response_ids or not estimator.per_call]
    return samples, {**metrics, "samples": float(len(samples)), **counts}


def with_advantages(
    samples: Sequence[Sample], advantages: Tensor, **aligned: Tensor | None
) -> list[Sample]:
    """``samples`` with their rows of ``advantages`` ``(M, T)`` as token advantages, and the
    rows of each ``aligned`` ``(M, T)`` tensor (``values``, ``returns``; None: left) likewise."""
    rows = {"token_advantages": advantages, **{k: x for k, x in aligned.items() if x is not None}}
    return [s.model_copy(update={name: x[i, : len(s.response_ids)].tolist()
                                 for name, x in rows.items()})
            for i, s in enumerate(samples)]  # fmt: skip


def tree_paths(credits: Sequence[PolicyCredit], samples: Sequence[Sample]) -> dict[str, object]:
    """``Sequences.tree_paths`` of ``samples`` (their rollouts in order of appearance, as
    `Sequences.of` counts them) when any rollout is a tree's leaf, else nothing. A rollout
    run from the start alone is a tree of one leaf."""
    paths = {(c.traj.row_id, c.traj.sample_index, c.policy): c.traj.tree_path for c in credits}
    if not any(paths.values()):
        return {}
    rollouts = dict.fromkeys((s.row_id, s.sample_index, s.policy) for s in samples)
    return {"tree_paths": [tuple(paths[k] or (k[1],)) for k in rollouts]}


def _segment_samples(credits: Sequence[PolicyCredit]) -> tuple[list[Sample], dict[str, object]]:
    """One sample (zero advantages) per trained segment of every credit."""
    return [
        Sample(
            row_id=c.traj.row_id, sample_index=c.traj.sample_index, policy=c.policy,
            node=seg.node, prompt_ids=seg.prompt_ids, response_ids=seg.response_ids,
            response_mask=seg.response_mask, old_logprobs=seg.response_logprobs,
            response_versions=seg.response_versions,
            token_advantages=[0.0] * len(seg.response_ids), reward=c.reward,
            weight=1.0 / len(c.segments),
        )
        for c in credits
        for seg in c.segments
    ], {}  # fmt: skip


def call_samples(credits: Sequence[PolicyCredit]) -> tuple[list[Sample], dict[str, object]]:
    """One sample (zero advantages) per trained call of every credit, calls that sampled
    nothing included (their rewards still count), and the `Sequences` fields they add: each
    call's reward (`call_rewards`) and anchor state (`call_anchors`)."""
    steps = [(credit, call, r) for credit in credits
             for call, r in zip(_calls(credit), call_rewards(credit), strict=True)]
    trajs = {id(c.traj): c.traj for c in credits}.values()
    anchors = {id(t): call_anchors(t) for t in trajs}
    versions = {id(t): _call_versions(t) for t in trajs}
    samples = [Sample(
        row_id=credit.traj.row_id, sample_index=credit.traj.sample_index,
        policy=credit.policy, node=call.node, prompt_ids=call.prompt_ids,
        response_ids=call.response_ids, response_mask=[1] * len(call.response_ids),
        old_logprobs=call.response_logprobs,
        response_versions=versions[id(credit.traj)][id(call)],
        token_advantages=[0.0] * len(call.response_ids), reward=credit.reward,
        weight=1.0 / len(_calls(credit)),
    ) for credit, call, _ in steps]  # fmt: skip
    return samples, {
        "step_rewards": torch.tensor([r for _, _, r in steps], dtype=torch.float64),
        "anchor_ids": [anchors[id(credit.traj)][id(call)] for credit, call, _ in steps],
    }


def call_rewards(credit: PolicyCredit) -> list[float]:
    """The reward of each of the policy's trained calls in the rollout, in call order."""
    calls = _calls(credit)
    stepped = [c for c in credit.traj.components if c.step is not None]
    rewards = [sum(c.value for c in stepped if c.credits(call.node, call.turn)) for call in calls]
    if rewards:  # the calls' rewards add up to the policy's reward
        rewards[-1] += credit.reward - sum(rewards)
    return rewards


def call_anchors(traj: Trajectory) -> dict[int, tuple[str, tuple[int, ...]]]:
    """Each call's anchor state, by ``id(call)``: its node and what it saw anew, i.e. the
    tokens added to its segment since the previous call (tool results, a user turn), or its
    whole prompt when it opens a segment. Rollouts of a row share their first anchor."""
    out: dict[int, tuple[str, tuple[int, ...]]] = {}
    last: dict[int, LLMCall] = {}  # the latest call of each segment
    for call in traj.calls:
        previous = last.get(call.segment_index)
        seen = 0 if previous is None else previous.prompt_length + len(previous.response_ids)
        out[id(call)] = (call.node, tuple(call.prompt_slice(seen)))
        last[call.segment_index] = call
    return out


def _calls(credit: PolicyCredit) -> list[LLMCall]:
    return [c for c in credit.traj.calls if c.trained and c.policy == credit.policy]


def _call_versions(traj: Trajectory) -> dict[int, list[int]]:
    """Each call's token versions, by ``id(call)``: its segment's mask-1 tokens are its calls'
    sampled tokens, in call order."""
    out: dict[int, list[int]] = {}
    taken = [0] * len(traj.segments)
    for call in traj.calls:
        seg = traj.segments[call.segment_index]
        sampled = [v for v, m in zip(seg.response_versions, seg.response_mask, strict=True) if m]
        start = taken[call.segment_index]
        out[id(call)] = sampled[start:start + len(call.response_ids)]
        taken[call.segment_index] = start + len(call.response_ids)
    return out
