"""The real TorchEngine serves a graph whose node calls the model twice; the traced rollouts,
selected back from MLflow, train on exactly the ids and logprobs the engine returned, under
the tokenizer loaded from the model folder, and are refused under another."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from agentrl_sdk.tracing import TrainingRun
from tests.engines._tiny import tiny_model_dir
from tests.production.conftest import ensure_experiment


class Recording:
    """Forwards to the engine and keeps every request and answer as the engine gave it."""

    def __init__(self, engine):
        self.engine = engine
        self.answers = []

    async def generate(self, prompt_ids, sampling, request_id, **kwargs):
        result = await self.engine.generate(prompt_ids, sampling, request_id, **kwargs)
        self.answers.append((list(prompt_ids), result))
        return result

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _graph():
    @sdk.trainable("agent")
    async def agent(state, config):
        llm = sdk.chat_model(config)
        first = await llm.ainvoke(state["messages"])
        follow_up = HumanMessage("Say it again, shorter.")
        second = await llm.ainvoke([*state["messages"], first, follow_up])
        return {"messages": [first, follow_up, second]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    return graph.compile()


def test_torch_engine_ids_and_logprobs_come_back_exactly(store, qwen_tokenizer):
    path = str(tiny_model_dir(0))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    engine = Recording(create_engine("torch", path))
    config = sdk.RolloutConfig(n=2, sampling=sdk.SamplingParams(temperature=1.0, max_tokens=12,
                                                                seed=5))
    rows = [{"id": "q1", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}]
    try:
        trajectories = asyncio.run(sdk.arollout_batch(
            _graph(), rows, engine, tokenizer=tokenizer, config=config, record_events=True))
    finally:
        engine.engine.close()
    assert [t.status for t in trajectories] == ["ok", "ok"]
    ensure_experiment(store, "served")
    run = TrainingRun(store, "served")
    try:
        run.log_traces(0, trajectories, tokenizer=tokenizer)
    finally:
        run.end()

    selection = sdk.traces(store, experiment="served", reward=lambda record: 1.0)
    assert len(selection) == 2 and selection.records[0].tokenizer.name == path
    samples = selection.samples(tokenizer, per_call=True)
    answered = sorted((prompt, r.token_ids, r.logprobs, r.versions) for prompt, r in engine.answers)
    traced = sorted((s.prompt_ids, s.response_ids, s.old_logprobs, s.response_versions)
                    for s in samples)
    assert len(traced) == 4 and traced == answered  # every request, id for id, logprob for logprob
    rows_again = selection.rows()
    assert [r["messages"] for r in rows_again] == [rows[0]["messages"]] * 2

    with pytest.raises(sdk.TraceMismatchError, match="2 trace\\(s\\) were made by tokenizer"):
        selection.samples(qwen_tokenizer)
