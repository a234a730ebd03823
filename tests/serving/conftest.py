"""A real TorchEngine over the tiny model folder, recording what it answered, and a LangGraph
graph whose node calls `sdk.chat_model` twice; sqlite stores come from tests/production."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from tests.engines._tiny import tiny_model_dir
from tests.production.conftest import (  # noqa: F401 - fixtures used by these tests
    _empty_db,
    _fluent_mlflow_restored,
    ensure_experiment,
    store,
)

ROLLOUT = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=1.0, max_tokens=10),
                            timeout_s=60.0)


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


@pytest.fixture(scope="module")
def model_dir():
    return str(tiny_model_dir(0))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture
def engine(model_dir):
    engine = Recording(create_engine("torch", model_dir))
    yield engine
    engine.engine.close()
