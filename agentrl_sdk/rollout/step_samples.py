"""Trajectories -> one training sample per LLM call, each with its own step-level advantage.

A step-level estimator gives the calls of one segment different advantages, so each trained
call becomes its own sample: the exact prompt the engine saw and the exact tokens it sampled
(their logprobs and policy versions sliced from the segment). A rollout's calls share its
weight, as its segments do for the rollout-level estimators.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl_sdk.algorithms.step_advantages import (
    StepBaseline,
    compute_anchor_advantages,
    compute_step_advantages,
)
from agentrl_sdk.rollout.credit import PolicyCredit, trainable_credits
from agentrl_sdk.types import LLMCall, Sample, Trajectory


def build_step_samples(
    trajectories: Sequence[Trajectory],
    *,
    gamma: float = 1.0,
    baseline: StepBaseline = "grpo",
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
    drop_flat_groups: bool = False,
    anchor_weight: float | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """One sample per trained LLM call that generated tokens, advantages per call.

    A call's reward is the components crediting that call (``step``); the policy's last call
    in the rollout also earns the rest of the policy's reward (`policy_reward`: its share of
    the outcome and its nodes' call-agnostic credit). Returns are discounted by ``gamma`` over
    the policy's calls; groups are ``(row, policy)`` (`compute_step_advantages`). With
    ``anchor_weight``, GiGPO: calls from equal anchor states (`call_anchors`) also form step
    groups, weighted by it (`compute_anchor_advantages`).

    Returns:
        The samples and metrics (``samples``, ``rollouts_skipped``,
        ``groups_dropped_no_signal``, step advantage statistics).
    """
    credits, counts = trainable_credits(
        trajectories, policies=policies, outcome_weight=outcome_weight,
        drop_flat_groups=drop_flat_groups,
    )  # fmt: skip
    steps = [(i, call, r) for i, credit in enumerate(credits)
             for call, r in zip(_calls(credit), call_rewards(credit), strict=True)]
    if not steps:
        return [], {"samples": 0.0, **counts}
    rewards = torch.tensor([r for _, _, r in steps], dtype=torch.float64)
    rollout = torch.tensor([i for i, _, _ in steps])
    groups = [c.group for c in credits]
    if anchor_weight is None:
        adv, metrics = compute_step_advantages(rewards, rollout, groups, gamma, baseline)
    else:
        anchors = {id(t): call_anchors(t) for t in {id(c.traj): c.traj for c in credits}.values()}
        adv, metrics = compute_anchor_advantages(
            rewards, rollout, groups, [anchors[id(credits[i].traj)][id(call)]
                                       for i, call, _ in steps],
            gamma=gamma, baseline=baseline, omega=anchor_weight,
        )  # fmt: skip
    versions = {id(t): _call_versions(t) for t in {id(c.traj): c.traj for c in credits}.values()}
    samples = []
    for (i, call, _), a in zip(steps, adv.tolist(), strict=True):
        credit = credits[i]
        if not call.response_ids:
            continue  # nothing was sampled: nothing to train
        samples.append(Sample(
            row_id=credit.traj.row_id, sample_index=credit.traj.sample_index,
            policy=credit.policy, node=call.node, prompt_ids=call.prompt_ids,
            response_ids=call.response_ids, response_mask=[1] * len(call.response_ids),
            old_logprobs=call.response_logprobs,
            response_versions=versions[id(credit.traj)][id(call)],
            advantage=float(a), reward=credit.reward, weight=1.0 / len(_calls(credit)),
        ))  # fmt: skip
    return samples, {**metrics, "samples": float(len(samples)), **counts}


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
