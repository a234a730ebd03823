"""Rewards scoring (failures counted, never fatal) and trajectory -> sample building."""

from __future__ import annotations

import math


from agentrl_sdk.algorithms import make_estimator
from agentrl_sdk.rollout.rewards import score
from agentrl_sdk.types import RewardComponent, Segment, Trajectory
from tests.rollout._samples import build_samples


def _segment(node="solver", policy="default", trained=True, n=3) -> Segment:
    return Segment(
        node=node, policy=policy, trained=trained, prompt_ids=[1, 2], response_ids=[5] * n,
        response_mask=[1] * n, response_logprobs=[-0.1] * n, response_versions=[0] * n,
    )


def _traj(row="r", index=0, segments=None, status="ok", state=None) -> Trajectory:
    return Trajectory(row_id=row, sample_index=index, segments=segments or [_segment()],
                      status=status, final_state=state or {"answer": index})


async def test_reward_values_components_and_failures_are_handled():
    trajs = [_traj(index=i) for i in range(6)] + [_traj(index=6, status="graph_error")]
    trajs[0].components.append(RewardComponent(name="solver", value=0.5))  # emitted in a node

    def reward(state, row, traj):
        i = state["answer"]
        return [1.0, {"a": 0.25, "b": 0.5}, None, math.nan, "x", 0.0][i] if i != 5 else 1 / 0

    counts = await score(trajs, {"r": {}}, reward, failed_rollout_reward=-1.0)
    assert [t.reward for t in trajs] == [1.5, 0.75, 0.0, 0.0, 0.0, 0.0, -1.0]
    assert trajs[1].rewards == {"a": 0.25, "b": 0.5}
    assert counts == {"reward_errors": 4, "rollouts_failed": 1}
    assert "returned None" in trajs[2].error and "ZeroDivisionError" in trajs[5].error

    dropped = [_traj(index=2)]
    await score(dropped, {"r": {}}, reward, on_error="drop")
    assert dropped[0].reward is None


async def test_async_reward_function():
    async def reward(state, row, traj):
        return row["target"] == state["answer"]

    trajs = [_traj(index=i) for i in range(2)]
    counts = await score(trajs, {"r": {"target": 1}}, reward)
    assert [t.reward for t in trajs] == [0.0, 1.0]  # bools score 0 / 1
    assert counts == {}


def test_samples_share_rollout_advantage_and_weight():
    # Row r: rollout 0 made two trained calls (two segments), rollout 1 one; plus a frozen one.
    t0 = _traj(index=0, segments=[_segment(), _segment(node="solver2")])
    t1 = _traj(index=1, segments=[_segment(), _segment(node="critic", trained=False)])
    t0.reward, t1.reward = 1.0, 0.0
    lonely = _traj(row="s", index=0)
    lonely.reward = 5.0
    skipped = _traj(row="s", index=1)
    samples, metrics = build_samples([t0, t1, lonely, skipped], estimator=make_estimator("grpo"))

    assert [(s.row_id, s.sample_index, s.node, s.weight) for s in samples] == [
        ("r", 0, "solver", 0.5), ("r", 0, "solver2", 0.5), ("r", 1, "solver", 1.0),
        ("s", 0, "solver", 1.0),
    ]
    # GRPO over {1, 0}: mean 0.5, unbiased std 0.7071 -> +-0.7071; a group of one gets 0.
    adv = [round(s.advantage, 4) for s in samples]
    assert adv == [0.7071, 0.7071, -0.7071, 0.0]
    assert metrics["rollouts_skipped"] == 1.0
    assert samples[0].old_logprobs == [-0.1] * 3


def test_samples_only_for_requested_policies():
    t = _traj(segments=[_segment(policy="planner"), _segment()])
    t.reward = 1.0
    samples, _ = build_samples([t], policies=["default"])
    assert [s.policy for s in samples] == ["default"]
    assert samples[0].weight == 1.0
