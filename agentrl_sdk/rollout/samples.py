"""Credited rollouts -> training samples, cut as the estimator reads them (segments or calls)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl_sdk.rollout.credit import PolicyCredit
from agentrl_sdk.types import LLMCall, Sample, Trajectory


def samples_of(
    credits: Sequence[PolicyCredit], *, per_call: bool = False
) -> tuple[list[Sample], dict[str, object]]:
    """One sample (zero advantages) per trained segment of every credit, or per trained LLM
    call when ``per_call`` (a step-level estimator); and the `Sequences` fields they add
    (`call_samples`, `tree_paths`).

    Every sample of a rollout gets a ``weight`` of ``1 / (its trained segments or calls for
    that policy)``, so each rollout counts once. A step-level estimator gives the calls of one
    segment different advantages, so each trained call becomes its own sample: the exact
    prompt the engine saw and the exact tokens it sampled (their logprobs and policy versions
    sliced from the segment).
    """
    samples, extra = call_samples(credits) if per_call else _segment_samples(credits)
    return samples, extra | tree_paths(credits, samples)


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
