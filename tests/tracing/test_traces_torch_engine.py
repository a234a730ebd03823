"""32 concurrent rollouts of the tool-selection agent on the real TorchEngine: each trace holds
its own rollout's LLM calls, engine calls and tool results, and nothing else."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import ToolMessage
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from agentrl_sdk.tracing import build_trace
from examples.tool_selection.agent import build_graph, graph_input, make_rows
from examples.tool_selection.model import model_path

pytestmark = pytest.mark.slow


def test_32_concurrent_rollouts_on_the_torch_engine_trace_apart():
    path = str(model_path(progress=False))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    engine = create_engine("torch", path, max_batch_size=64)
    config = sdk.RolloutConfig(n=8, concurrency=32, recursion_limit=8,
                               sampling=sdk.SamplingParams(temperature=1.0, max_tokens=32, seed=3))
    try:
        trajectories = asyncio.run(sdk.arollout_batch(
            build_graph(), make_rows(4, seed=9), engine, tokenizer=tokenizer, config=config,
            input_fn=graph_input, record_events=True,
        ))
    finally:
        engine.close()
    assert len(trajectories) == 32
    tool_spans = 0
    for traj in trajectories:
        _, spans = build_trace(traj, experiment_id="0", step=0, tokenizer=tokenizer)
        by_id = {s.span_id: s for s in spans}
        kind = {s.span_id: s.attributes.get("agentrl.kind") for s in spans}
        llms = [s for s in spans if kind[s.span_id] == "llm"]
        assert [s.attributes["agentrl.request_id"] for s in llms] == [
            c.request_id for c in traj.calls]
        assert all(r.startswith(f"{traj.row_id}:{traj.sample_index}-")
                   for r in (c.request_id for c in traj.calls))
        for s in spans[1:]:
            parent = by_id[s.parent_id]
            assert parent.start_time_ns <= s.start_time_ns <= s.end_time_ns <= parent.end_time_ns
            expected = {"node": None, "llm": "node", "engine": "llm", "tool": "node"}[kind[s.span_id]]
            assert kind.get(parent.span_id) == expected
        # Tool spans show exactly the tool results of this rollout's own final state.
        tools = [s.outputs["content"] for s in spans
                 if kind[s.span_id] == "tool" and "malformed" not in s.name and s.outputs]
        own = [m.content for m in (traj.final_state or {}).get("messages", [])
               if isinstance(m, ToolMessage) and m.status != "error"]
        if traj.status == "ok":  # a failed rollout has no final state to compare with
            assert tools == own
            tool_spans += len(tools)
    # The warm-started policy finishes and calls a tool in most rollouts.
    assert sum(t.status == "ok" for t in trajectories) >= 16 and tool_spans >= 16
