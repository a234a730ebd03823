"""Tiny Qwen-vocabulary policies warm-started to act out tool use and thinking, on TorchEngine."""

from __future__ import annotations

import pytest

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import build_tiny_model, supervised_warm_start
from examples.calculator.agent import make_rows

CALC_ROWS = make_rows(4, seed=3)
THINK_CONVERSATION = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nhi"},
    {"role": "user", "content": "Again."},
    {"role": "assistant", "content": "<think>\nOnce more.\n</think>\n\nhi again"},
]


@pytest.fixture(scope="session")
def calc_engine(qwen_tokenizer):
    """A policy that solves CALC_ROWS with three tool-using turns (compact JSON calls).

    The same recipe as tests/gateway's ``calc_model_dir`` (80 warm-start steps of this
    tokenizer's tiny model), so it loads that disk-cached build instead of warm-starting it
    again in every worker process."""
    from agentrl_sdk.models import load_pretrained_pair
    from tests.gateway.conftest import calc_model_dir  # (that module imports this one)

    model, _ = load_pretrained_pair(calc_model_dir())
    engine = TorchEngine(model)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def think_engine(qwen3_tokenizer):
    """A policy that thinks (``<think>``) before answering, under the Qwen3 template."""
    model = build_tiny_model(qwen3_tokenizer, hidden_size=64, num_layers=2)
    supervised_warm_start(model, qwen3_tokenizer, [THINK_CONVERSATION], steps=80, lr=1e-2,
                          progress=False)
    engine = TorchEngine(model)
    yield engine
    engine.close()
