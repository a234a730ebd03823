"""The real TorchEngine serving a graph whose node calls the model twice, its rollouts traced
into an MLflow store, with the engine's own record of every request and answer."""

from __future__ import annotations

import asyncio

from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from agentrl_sdk.tracing import TrainingRun
from tests.production.conftest import ensure_experiment

QUESTION = {"id": "q1", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


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


def two_call_graph():
    """One trainable node that asks the model, then asks it again to be shorter."""

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


def serve_on_torch_engine(store: str, path: str, *, n: int, max_tokens: int, seed: int):
    """``n`` sampled rollouts of `QUESTION` on the TorchEngine over ``path``, traced into
    experiment ``served`` of ``store``; the trajectories and the engine's ``(prompt ids,
    result)`` answers."""
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    engine = Recording(create_engine("torch", path))
    config = sdk.RolloutConfig(n=n, sampling=sdk.SamplingParams(
        temperature=1.0, max_tokens=max_tokens, seed=seed))
    try:
        trajectories = asyncio.run(sdk.arollout_batch(
            two_call_graph(), [QUESTION], engine, tokenizer=tokenizer, config=config, record_events=True))
    finally:
        engine.engine.close()
    ensure_experiment(store, "served")
    run = TrainingRun(store, "served")
    try:
        run.log_traces(0, trajectories, tokenizer=tokenizer)
    finally:
        run.end()
    return trajectories, engine.answers
