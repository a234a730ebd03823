"""The OpenAI SDK as the gateway's client: a multi-turn tool agent is recorded token-exactly."""

from __future__ import annotations

from itertools import groupby

import pytest
from openai import AsyncOpenAI

import agentrl_sdk as sdk
from agentrl_sdk.gateway import Gateway
from examples.calculator.agent import build_graph
from examples.openai_agent.agent import agent, calculator_agent, reward
from tests.gateway.conftest import CALC_ROWS, RecordingEngine

pytestmark = pytest.mark.slow
GREEDY = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48))


def _runs(segment):
    pairs = zip(segment.response_ids, segment.response_mask, strict=True)
    return [(m, [t for t, _ in run]) for m, run in groupby(pairs, key=lambda p: p[1])]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_tool_agent_trajectory_is_what_the_engine_generated(
    calc_engine, qwen_tokenizer, stream
):
    row = CALC_ROWS[0]
    a, b, c = row["operands"]
    engine = RecordingEngine(calc_engine)
    async with Gateway(engine, qwen_tokenizer, rollout=GREEDY) as gateway:
        gateway.open("r0", row_id=row["id"])
        client = AsyncOpenAI(base_url=gateway.rollout_url("r0"), api_key=gateway.api_key,
                             max_retries=0, timeout=60)
        conversation = await calculator_agent(client, row, stream=stream)
        traj = gateway.close("r0")

    assert conversation[-1]["content"] == f"The answer is {row['answer']}."
    assert reward(conversation, row, traj) == {"first_call": 0.25, "second_call": 0.25,
                                               "answer": 0.5}
    assert traj.status == "ok" and traj.row_id == row["id"]
    # Three calls, one segment: every follow-up extended the ledger instead of re-templating.
    assert len(traj.calls) == 3 == len(engine.results)
    (seg,) = traj.segments
    for call, prompt, result in zip(traj.calls, engine.prompts, engine.results, strict=True):
        assert call.prompt_ids == prompt
        assert call.response_ids == result.token_ids
        assert call.response_logprobs == result.logprobs
        assert call.policy_version == result.policy_version
    assert seg.prompt_ids == engine.prompts[0]
    # Mask 1 = exactly the sampled ids, call after call; mask 0 = the tool results.
    runs = _runs(seg)
    assert [ids for m, ids in runs if m == 1] == [r.token_ids for r in engine.results]
    assert [qwen_tokenizer.decode(ids) for m, ids in runs if m == 0] == [
        f"\n<|im_start|>user\n<tool_response>\n{v}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        for v in (a + b, (a + b) * c)
    ]
    generated = [lp for r in engine.results for lp in r.logprobs]
    assert [lp for lp, m in zip(seg.response_logprobs, seg.response_mask) if m] == generated
    assert [lp for lp, m in zip(seg.response_logprobs, seg.response_mask) if not m] == [0.0] * (
        len(seg.response_mask) - sum(seg.response_mask)
    )


async def test_gateway_rollout_equals_the_langgraph_rollout(calc_engine, qwen_tokenizer):
    """The same greedy conversation through the gateway and through TokenChatModel in a
    LangGraph graph yields the same token sequences."""
    row = CALC_ROWS[1]
    (graph_traj,) = await sdk.arollout(build_graph(), row, calc_engine, tokenizer=qwen_tokenizer,
                                       config=GREEDY)

    (agent_traj,) = await sdk.arollout(agent, row, calc_engine, tokenizer=qwen_tokenizer,
                                       config=GREEDY)
    assert agent_traj.status == "ok", agent_traj.error
    assert agent_traj.final_state[-1]["content"] == f"The answer is {row['answer']}."
    fields = {"prompt_ids", "response_ids", "response_mask", "response_versions", "num_calls"}
    assert [s.model_dump(include=fields) for s in agent_traj.segments] == [
        s.model_dump(include=fields) for s in graph_traj.segments
    ]
    assert [c.response_ids for c in agent_traj.calls] == [c.response_ids for c in graph_traj.calls]
