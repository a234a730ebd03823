"""Credit per node and policy: what each policy's samples earn, and groups with no signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl_sdk.algorithms import make_estimator
from agentrl_sdk.rollout.credit import credit_policies, flat_groups, policy_reward
from agentrl_sdk.rollout.rewards import score
from agentrl_sdk.types import RewardComponent, Segment, Trajectory
from tests.rollout._samples import build_samples


def _segment(node: str, policy: str) -> Segment:
    return Segment(node=node, policy=policy, prompt_ids=[1], response_ids=[5, 6],
                   response_mask=[1, 1], response_logprobs=[-0.1, -0.2],
                   response_versions=[0, 0])


def _team(index: int, outcome: float, a_credit: float | None) -> Trajectory:
    """A rollout where node A (policy "pa") and node B (policy "pb") both made a call."""
    traj = Trajectory(row_id="r", sample_index=index,
                      segments=[_segment("A", "pa"), _segment("B", "pb")])
    if a_credit is not None:
        traj.components.append(RewardComponent(name="a_only", value=a_credit, node="A"))
    traj.reward = outcome + (a_credit or 0.0)
    return traj


def _advantages(samples, policy: str) -> list[float]:
    return [s.advantage for s in samples if s.policy == policy]


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_component_crediting_node_a_leaves_node_b_advantages_unchanged(estimator):
    outcomes = [1.0, 0.0, 0.5, 0.0]
    plain = [_team(i, r, None) for i, r in enumerate(outcomes)]
    credited = [_team(i, r, c) for i, (r, c) in enumerate(zip(outcomes, [0.0, 3.0, -2.0, 1.0]))]

    before, _ = build_samples(plain, estimator=make_estimator(estimator))
    after, _ = build_samples(credited, estimator=make_estimator(estimator))

    assert _advantages(after, "pb") == _advantages(before, "pb")
    assert _advantages(after, "pa") != _advantages(before, "pa")
    assert [s.reward for s in after if s.policy == "pb"] == outcomes
    assert [s.reward for s in after if s.policy == "pa"] == [1.0, 3.0, -1.5, 1.0]


def test_outcome_weight_scales_the_shared_part_only():
    traj = _team(0, outcome=2.0, a_credit=0.5)
    assert policy_reward(traj, {"A"}, outcome_weight=0.0) == 0.5
    assert policy_reward(traj, {"B"}, outcome_weight=0.25) == 0.5
    assert policy_reward(traj, {"A", "B"}) == traj.reward == 2.5


def test_a_node_credits_the_calls_under_its_graph_path_and_a_step_its_node():
    routed = RewardComponent(name="route", value=1.0, node="team")
    assert routed.credits("team/researcher/agent") and routed.credits("team")
    assert not routed.credits("teammate") and not routed.credits("other/team")
    one_call = RewardComponent(name="fmt", value=1.0, node="agent", step=1)
    assert one_call.credits("agent") and one_call.credits("agent", 1)
    assert not one_call.credits("agent", 0)
    assert not RewardComponent(name="outcome", value=1.0).credits("agent")


@pytest.mark.parametrize("component", [
    RewardComponent(name="r", value=1.0),
    RewardComponent(name="a@b", value=-2.5, node="supervisor/agent"),  # any name, any node
    RewardComponent(name="r", value=0.0, node="agent#1", step=3),
])
def test_components_travel_as_json_typed(component):
    traj = Trajectory(row_id="r", components=[component])
    assert Trajectory.model_validate_json(traj.model_dump_json()).components == [component]


@pytest.mark.parametrize("value", [np.float32(1.5), np.int64(2), np.float64(-1), True, 3,
                                   torch.tensor(0.5)])
def test_numbers_of_any_kind_are_rewards(value):
    assert RewardComponent(name="r", value=value).value == float(value)


@pytest.mark.parametrize("value", ["1", b"1", None, float("nan"), np.float32("inf"), [1.0]])
def test_non_numbers_and_non_finite_values_are_refused(value):
    with pytest.raises(ValueError, match="not a finite number"):
        RewardComponent(name="r", value=value)


def test_a_step_needs_a_node():
    with pytest.raises(ValueError, match="no node"):
        RewardComponent(name="a", value=1.0, step=0)


async def test_reward_functions_return_numpy_scalars_and_credited_components():
    trajs = [Trajectory(row_id="r", sample_index=i, segments=[_segment("A", "pa")])
             for i in range(3)]
    values = iter([np.float32(1.0), np.int64(1),
                   [RewardComponent(name="ans", value=0.5, node="A"),
                    RewardComponent(name="team", value=np.float64(1.0))]])

    counts = await score(trajs, {"r": {}}, lambda state, row, traj: next(values))

    assert counts == {}
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.5]
    assert {(c.name, c.value, c.node) for c in trajs[2].components} == {
        ("ans", 0.5, "A"), ("team", 1.0, None)}


def test_flat_groups_are_found_per_policy_and_dropped_on_request():
    # pb's rewards differ only through the shared outcome; pa's credit cancels it out.
    trajs = [_team(0, 1.0, -1.0), _team(1, 0.0, 0.0)]
    credits = credit_policies(trajs)
    assert flat_groups(credits) == {("r", "pa")}

    samples, metrics = build_samples(trajs, drop_flat_groups=True)
    assert {s.policy for s in samples} == {"pb"}
    assert metrics["groups_dropped_no_signal"] == 1.0
    kept, metrics = build_samples(trajs)
    assert {s.policy for s in kept} == {"pa", "pb"} and metrics["groups_dropped_no_signal"] == 0
