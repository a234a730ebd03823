"""Who earns which reward: one rollout's reward per policy, from the components crediting its
nodes plus the weighted shared outcome; groups of ``(row, policy)`` with no signal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl_sdk.types import Segment, Trajectory

GroupKey = tuple[str, str]
"""``(row_id, policy)``: the rollouts whose rewards an advantage compares."""


@dataclass(frozen=True)
class PolicyCredit:
    """One rollout's part for one policy: its trained segments and the reward they earn."""

    traj: Trajectory
    policy: str
    segments: list[Segment]
    reward: float

    @property
    def group(self) -> GroupKey:
        return (self.traj.row_id, self.policy)


def policy_reward(traj: Trajectory, nodes: set[str], outcome_weight: float = 1.0) -> float:
    """``outcome_weight * outcome + sum(components crediting any of nodes)``.

    The outcome is ``traj.reward`` less every node-credited component: the reward function's
    shared value, shared emitted rewards, or the failed-rollout reward.
    """
    assert traj.reward is not None, "score the trajectory first"
    credited = [c for c in traj.components if c.node is not None]
    outcome = traj.reward - sum(c.value for c in credited)
    own = sum(c.value for c in credited if any(c.credits(node) for node in nodes))
    return outcome_weight * outcome + own


def credit_policies(
    trajectories: Sequence[Trajectory],
    *,
    policies: Sequence[str] | None = None,
    outcome_weight: float = 1.0,
) -> list[PolicyCredit]:
    """Every scored rollout's credit for each policy that trained segments in it.

    Rollouts with ``reward`` None (dropped) are left out; so are policies not in ``policies``
    (all when None).
    """
    out = []
    for traj in trajectories:
        if traj.reward is None:
            continue
        by_policy: dict[str, list[Segment]] = {}
        for seg in traj.trained_segments:
            if policies is None or seg.policy in policies:
                by_policy.setdefault(seg.policy, []).append(seg)
        for policy, segs in by_policy.items():
            reward = policy_reward(traj, {s.node for s in segs}, outcome_weight)
            out.append(PolicyCredit(traj, policy, segs, reward))
    return out


def flat_groups(credits: Sequence[PolicyCredit]) -> set[GroupKey]:
    """The groups whose rewards all agree (singletons too): their advantages are all zero,
    so training on them only dilutes the batch (DAPO's dynamic sampling drops them)."""
    rewards: dict[GroupKey, set[float]] = {}
    for credit in credits:
        rewards.setdefault(credit.group, set()).add(credit.reward)
    return {group for group, values in rewards.items() if len(values) == 1}

