"""Per-call samples of the step-level estimator: exact tokens of each call, its reward."""

from __future__ import annotations

import json
from typing import Annotated, TypedDict

import pytest
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

import agentrl_sdk as sdk
from agentrl_sdk.algorithms import make_estimator
from agentrl_sdk.rollout.credit import credit_policies
from agentrl_sdk.rollout.samples import call_anchors, call_rewards
from agentrl_sdk.types import LLMCall, RewardComponent, Segment, Trajectory
from tests.rollout._samples import build_samples


class State(TypedDict):
    messages: Annotated[list, add_messages]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _two_call_rollout(index: int, outcome: float, first_call_bonus: float) -> Trajectory:
    """One segment of node "agent": call 0 sampled [11, 12], a tool result [90, 91] came
    back, call 1 sampled [13] (with newer weights); and a frozen judge's call."""
    segment = Segment(node="agent", prompt_ids=[1, 2], response_ids=[11, 12, 90, 91, 13],
                      response_mask=[1, 1, 0, 0, 1], response_logprobs=[-1, -2, 0, 0, -3],
                      response_versions=[4, 4, -1, -1, 5])
    judge = Segment(node="judge", trained=False, prompt_ids=[3], response_ids=[50],
                    response_mask=[1], response_logprobs=[-0.5], response_versions=[4])

    def call(turn, prompt, ids, logprobs, segment_index=0, node="agent", trained=True):
        return LLMCall(node=node, turn=turn, trained=trained, prompt_ids=prompt,
                       response_ids=ids, response_logprobs=logprobs, finish_reason="stop",
                       policy_version=4 + turn, segment_index=segment_index, request_id="x")

    traj = Trajectory(row_id="r", sample_index=index, segments=[segment, judge], calls=[
        call(0, [1, 2], [11, 12], [-1, -2]),
        call(1, [1, 2, 11, 12, 90, 91], [13], [-3]),
        call(0, [3], [50], [-0.5], segment_index=1, node="judge", trained=False),
    ])
    bonus = RewardComponent(name="format", value=first_call_bonus, node="agent", step=0)
    traj.components.append(bonus)
    traj.reward = outcome + first_call_bonus
    return traj


def test_each_call_is_a_sample_with_its_exact_tokens_and_share_of_the_rollout():
    trajs = [_two_call_rollout(0, 1.0, 0.5), _two_call_rollout(1, 0.0, 0.0)]
    samples, metrics = build_samples(trajs, estimator=make_estimator("step", baseline="drgrpo"))
    assert metrics["samples"] == 4.0  # the frozen judge's call is not trained
    first, second = samples[:2]
    assert (first.prompt_ids, first.response_ids, first.old_logprobs,
            first.response_versions) == ([1, 2], [11, 12], [-1, -2], [4, 4])
    assert (second.prompt_ids, second.response_ids, second.old_logprobs,
            second.response_versions) == ([1, 2, 11, 12, 90, 91], [13], [-3], [5])
    assert all(s.response_mask == [1] * len(s.response_ids) for s in samples)
    assert [s.weight for s in samples] == [0.5] * 4
    # Returns: rollout 0 calls earn 0.5 then 1.0 (G = 1.5, 1.0); rollout 1 earns 0 (G = 0, 0).
    # Dr.GRPO baseline: the mean rollout return 0.75.
    assert [s.advantage for s in samples] == pytest.approx([0.75, 0.25, -0.75, -0.75])


def test_call_rewards_add_up_to_the_policy_reward():
    traj = _two_call_rollout(0, outcome=2.0, first_call_bonus=0.5)
    (credit,) = credit_policies([traj], outcome_weight=0.5)
    assert call_rewards(credit) == [0.5, 1.0]  # the bonus at call 0; half the outcome at the end
    assert sum(call_rewards(credit)) == credit.reward


async def test_call_samples_of_a_recorded_tool_rollout_are_prefixes_of_its_segment(
    qwen_tokenizer, scripted
):
    async def solver(state, config):
        reply = await sdk.chat_model(config).bind_tools([add]).ainvoke(state["messages"])
        sdk.emit_reward(0.25, name="called", step=-1)
        return {"messages": [reply]}

    g = StateGraph(State)
    g.add_node("solver", solver)
    g.add_node("tools", sdk.ToolNode([add]))
    g.add_edge(START, "solver")
    g.add_conditional_edges("solver", sdk.tools_condition)
    g.add_edge("tools", "solver")
    tool_call = "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) \
        + "\n</tool_call>"
    row = {"id": "r", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    (traj,) = await sdk.arollout(g.compile(), row, scripted(qwen_tokenizer, [tool_call, "5"]),
                                 tokenizer=qwen_tokenizer)
    assert traj.status == "ok" and len(traj.calls) == 2 and len(traj.segments) == 1
    traj.reward = sum(traj.rewards.values())

    samples, _ = build_samples([traj], estimator=make_estimator("step"))

    (segment,) = traj.segments
    sequence = segment.prompt_ids + segment.response_ids
    assert [s.response_ids for s in samples] == [c.response_ids for c in traj.calls]
    for s in samples:
        assert sequence[:len(s.prompt_ids) + len(s.response_ids)] == s.prompt_ids + s.response_ids
    assert sum(len(s.response_ids) for s in samples) == sum(segment.response_mask)
    (credit,) = credit_policies([traj])
    assert call_rewards(credit) == [0.25, 0.25]  # one step reward per call


def test_gigpo_groups_the_calls_that_start_from_the_same_anchor_state():
    trajs = [_two_call_rollout(0, 1.0, 0.5), _two_call_rollout(1, 0.0, 0.0)]
    anchors = [call_anchors(t) for t in trajs]
    first, second = ([a[id(t.calls[k])] for t, a in zip(trajs, anchors)] for k in (0, 1))
    assert first == [("agent", (1, 2))] * 2  # the row's prompt
    assert second == [("agent", (90, 91))] * 2  # the same tool result came back

    samples, metrics = build_samples(
        trajs, estimator=make_estimator("step", baseline="drgrpo", omega=1.0)
    )
    # Episode: totals 1.5, 0 -> +-0.75. Steps: returns {1.5, 0} at the first anchor -> +-0.75,
    # {1.0, 0} at the second -> +-0.5.
    assert [s.advantage for s in samples] == pytest.approx([1.5, 1.25, -1.5, -1.25])
    assert metrics["step_groups"] == 2.0
