"""A real TorchEngine over the tiny model folder, recording what it answered, and a LangGraph
graph whose node calls `sdk.chat_model` twice; sqlite stores come from tests/production."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import agentrl_sdk as sdk
from agentrl_sdk.engines import create_engine
from tests.engines._tiny import tiny_model_dir
from tests.production._torch_serving import Recording, two_call_graph  # noqa: F401 - shared
from tests.production.conftest import (  # noqa: F401 - fixtures used by these tests
    _empty_db,
    _fluent_mlflow_restored,
    ensure_experiment,
    store,
)

ROLLOUT = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=1.0, max_tokens=10),
                            timeout_s=60.0)


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
