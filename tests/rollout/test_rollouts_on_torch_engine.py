"""Acceptance: token-exact rollouts of real LangGraph graphs on the real TorchEngine."""

from __future__ import annotations

from itertools import groupby
from typing import Annotated, TypedDict

import pytest
import torch
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import agentrl_sdk as sdk
from agentrl_sdk.chat import ChatTemplate
from agentrl_sdk.chat.messages import to_openai_tools, to_template_message
from examples.calculator.agent import build_graph, calculator

from examples.calculator.agent import make_rows

pytestmark = pytest.mark.slow
CALC_ROWS = make_rows(4, seed=3)  # the rows the calc_engine fixture was warm-started on
GREEDY = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48))


def _runs(segment):
    """(mask, ids) runs of a segment's response."""
    pairs = zip(segment.response_ids, segment.response_mask, strict=True)
    return [(m, [t for t, _ in run]) for m, run in groupby(pairs, key=lambda p: p[1])]


def _exact(segment) -> dict:
    return segment.model_dump(exclude={"response_logprobs"})


def _reference_logprobs(model, segment) -> torch.Tensor:
    ids = torch.tensor([segment.prompt_ids + segment.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return logp[len(segment.prompt_ids) - 1 :]


async def test_three_turn_tool_rollout_is_token_exact(calc_engine, qwen_tokenizer):
    row = CALC_ROWS[0]
    a, b, c = row["operands"]
    (traj,) = await sdk.arollout(build_graph(), row, calc_engine, tokenizer=qwen_tokenizer,
                                 config=GREEDY)
    assert traj.status == "ok", traj.error
    assert len(traj.calls) == 3
    (seg,) = traj.segments

    # Mask-1 tokens are exactly what the engine generated, call after call.
    assert seg.generated_ids == [t for call in traj.calls for t in call.response_ids]
    for call in traj.calls:
        assert (seg.prompt_ids + seg.response_ids)[: len(call.prompt_ids)] == call.prompt_ids
    # Mask-0 tokens are the tool results and the template text around them.
    observations = [qwen_tokenizer.decode(ids) for m, ids in _runs(seg) if m == 0]
    assert observations == [
        f"\n<|im_start|>user\n<tool_response>\n{v}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        for v in (a + b, (a + b) * c)
    ]
    # Logprobs align 1:1 with tokens and equal the model's own (greedy: raw) logprobs.
    assert len(seg.response_logprobs) == len(seg.response_ids)
    mask = torch.tensor(seg.response_mask, dtype=torch.bool)
    recorded = torch.tensor(seg.response_logprobs)
    reference = _reference_logprobs(calc_engine.model, seg)
    torch.testing.assert_close(recorded[mask], reference[mask], atol=1e-4, rtol=0)
    assert (recorded[~mask] == 0).all()
    assert traj.final_state["messages"][-1].content == f"The answer is {row['answer']}."


async def test_compact_json_is_trained_as_generated(calc_engine, qwen_tokenizer):
    row = CALC_ROWS[1]
    a, b, _ = row["operands"]
    (traj,) = await sdk.arollout(build_graph(), row, calc_engine, tokenizer=qwen_tokenizer,
                                 config=GREEDY)
    seg = traj.segments[0]
    compact = f'{{"name":"calculator","arguments":{{"expression":"{a}+{b}"}}}}'
    assert compact in qwen_tokenizer.decode(seg.generated_ids)
    # Re-templating the history renders the call with spaces: other tokens than sampled.
    template = ChatTemplate(qwen_tokenizer)
    last = traj.calls[-1]
    history = [to_template_message(m) for m in traj.final_state["messages"][:-1]]
    retemplated = template.encode(
        template.render(history, to_openai_tools([calculator]), add_generation_prompt=True)
    )
    assert '"expression": "' in qwen_tokenizer.decode(retemplated)
    assert retemplated != last.prompt_ids
    assert len(traj.segments) == 1


class Chat(TypedDict):
    messages: Annotated[list, add_messages]


async def test_think_stripping_template_starts_a_new_segment(think_engine, qwen3_tokenizer):
    @sdk.trainable("chat")
    async def chat(state, config):
        return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}

    def ask_again(state):
        return {"messages": [HumanMessage("Again.")]}

    def route(state):
        humans = sum(isinstance(m, HumanMessage) for m in state["messages"])
        return "ask_again" if humans < 2 else END

    g = StateGraph(Chat)
    g.add_node("chat", chat)
    g.add_node("ask_again", ask_again)
    g.add_edge(START, "chat")
    g.add_conditional_edges("chat", route)
    g.add_edge("ask_again", "chat")
    row = {"id": "think", "messages": [{"role": "user", "content": "Say hi."}]}
    (traj,) = await sdk.arollout(g.compile(), row, think_engine, tokenizer=qwen3_tokenizer,
                                 config=GREEDY)

    assert traj.status == "ok", traj.error
    first, second = traj.segments
    assert qwen3_tokenizer.decode(first.generated_ids) == (
        "<think>\nA greeting.\n</think>\n\nhi<|im_end|>"
    )
    assert second.started_because == "template_not_prefix_preserving"
    assert "A greeting." not in qwen3_tokenizer.decode(second.prompt_ids)
    assert traj.metrics["segments_started.template_not_prefix_preserving"] == 1
    assert first.generated_ids == traj.calls[0].response_ids
    assert second.generated_ids == traj.calls[1].response_ids


async def test_two_trainable_nodes_and_a_frozen_one(calc_engine, qwen_tokenizer):
    def node(name):
        async def call(state, config):
            msg = await sdk.chat_model(config).ainvoke(
                [{"role": "system", "content": f"You are the {name}."}, *state["messages"]]
            )
            return {"messages": [msg]}
        return call

    g = StateGraph(Chat)
    g.add_node("planner", sdk.trainable("planner", policy="planner")(node("planner")))
    g.add_node("solver", sdk.trainable("solver")(node("solver")))
    g.add_node("critic", sdk.frozen("critic")(node("critic")))
    g.add_edge(START, "planner")
    g.add_edge("planner", "solver")
    g.add_edge("solver", "critic")
    g.add_edge("critic", END)
    engines = {"planner": calc_engine, "default": calc_engine}
    config = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=1.0, max_tokens=12, seed=3))
    (traj,) = await sdk.arollout(g.compile(), CALC_ROWS[0], engines, tokenizer=qwen_tokenizer,
                                 config=config)

    assert traj.status == "ok", traj.error
    assert [(s.node, s.policy, s.trained) for s in traj.segments] == [
        ("planner", "planner", True), ("solver", "default", True), ("critic", "default", False),
    ]
    for seg, call in zip(traj.segments, traj.calls, strict=True):
        assert seg.generated_ids == call.response_ids
        assert seg.prompt_ids == call.prompt_ids
        assert f"You are the {seg.node}." in qwen_tokenizer.decode(seg.prompt_ids)


async def test_32_concurrent_rollouts_have_no_crosstalk(calc_engine, qwen_tokenizer):
    config = sdk.RolloutConfig(
        n=8, concurrency=32, sampling=sdk.SamplingParams(temperature=1.5, max_tokens=40, seed=0)
    )
    graph = build_graph()
    together = await sdk.arollout_batch(graph, CALC_ROWS, calc_engine, tokenizer=qwen_tokenizer,
                                        config=config)
    assert len(together) == 32
    alone_config = config.model_copy(update={"concurrency": 1})
    alone = []
    for row in CALC_ROWS:
        alone += await sdk.arollout_batch(graph, [row], calc_engine, tokenizer=qwen_tokenizer,
                                          config=alone_config)

    for t, s, row in zip(together, alone, [r for r in CALC_ROWS for _ in range(8)], strict=True):
        assert (t.row_id, t.sample_index) == (s.row_id, s.sample_index)
        assert t.status == s.status
        question = row["messages"][-1]["content"]
        for seg in t.segments:
            assert question in qwen_tokenizer.decode(seg.prompt_ids)
        assert [_exact(x) for x in t.segments] == [_exact(x) for x in s.segments]
        for x, y in zip(t.segments, s.segments, strict=True):
            # Batch shape moves float sums by ~1e-7; the sampled ids must not move at all.
            torch.testing.assert_close(x.response_logprobs, y.response_logprobs, atol=1e-5, rtol=0)
    # Samples of a row differ (per-request seeds), so equality above is not trivial.
    distinct = {tuple(t.segments[0].generated_ids) for t in together if t.segments}
    assert len(distinct) > len(CALC_ROWS)
