"""Over-long handling: DAPO's soft length penalty by hand, and the truncation filter."""

from __future__ import annotations

import pytest

from agentrl_sdk.rollout.overlong import add_overlong_penalties, overlong_penalty, truncated
from agentrl_sdk.types import LLMCall, Segment, Trajectory
from tests.rollout._samples import build_samples


@pytest.mark.parametrize(("length", "expected"), [
    (0, 0.0), (12, 0.0),  # up to max_length - buffer: no penalty
    (13, -0.25), (14, -0.5), (15, -0.75), (16, -1.0),  # (12 - L) / 4 inside the buffer
])
def test_soft_penalty_is_linear_over_the_buffer(length, expected):
    assert overlong_penalty(length, max_length=16, buffer=4) == expected
    assert overlong_penalty(length, max_length=16, buffer=4, penalty=0.5) == expected * 0.5


def test_a_zero_buffer_is_off():
    assert overlong_penalty(16, max_length=16, buffer=0) == 0.0


def _call(node: str, turn: int, tokens: int, finish="stop", policy="default", trained=True):
    return LLMCall(node=node, policy=policy, turn=turn, trained=trained, prompt_ids=[1],
                   response_ids=[7] * tokens, response_logprobs=[-0.1] * tokens,
                   finish_reason=finish, policy_version=0, segment_index=0, request_id="x")


def _rollout(index: int, calls: list[LLMCall], reward: float = 1.0) -> Trajectory:
    segments = [Segment(node=c.node, policy=c.policy, trained=c.trained, prompt_ids=[1],
                        response_ids=c.response_ids, response_mask=[1] * len(c.response_ids),
                        response_logprobs=c.response_logprobs,
                        response_versions=[0] * len(c.response_ids)) for c in calls]
    return Trajectory(row_id="r", sample_index=index, calls=calls, segments=segments,
                      reward=reward)


def test_truncated_means_the_last_call_ran_out_of_tokens():
    assert truncated(_rollout(0, [_call("a", 0, 3, "length"), _call("a", 1, 3)])) is False
    assert truncated(_rollout(0, [_call("a", 0, 3), _call("a", 1, 16, "length")])) is True
    assert truncated(Trajectory(row_id="r")) is False  # no call at all


def test_the_penalty_credits_the_node_that_wrote_the_long_response():
    # Node "writer" (policy pw) ran long on its second call; node "judge" (policy pj) did not.
    long_call = _call("writer", 1, 15, "stop", policy="pw")
    trajs = [
        _rollout(0, [_call("writer", 0, 2, policy="pw"), long_call, _call("judge", 0, 16,
                                                                          policy="pj",
                                                                          trained=False)]),
        _rollout(1, [_call("writer", 0, 2, policy="pw"), _call("judge", 0, 2, policy="pj")]),
    ]
    penalised = add_overlong_penalties(trajs, max_length=16, buffer=4)
    assert penalised == 1  # the frozen judge's long call trains nothing and is not penalised
    assert [(c.name, c.value, c.node, c.step) for c in trajs[0].components] == [
        ("overlong", -0.75, "writer", 1)]
    assert trajs[0].reward == 0.25 and trajs[1].reward == 1.0
    samples, _ = build_samples(trajs)
    assert [s.reward for s in samples if s.policy == "pw"] == [0.25, 0.25, 1.0]
