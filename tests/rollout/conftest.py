"""Tiny Qwen-vocabulary policies warm-started to act out tool use and thinking, on TorchEngine."""

from __future__ import annotations

import pytest

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import build_tiny_model, supervised_warm_start
from examples.calculator.agent import calculator, expert_conversation, make_rows

CALC_ROWS = make_rows(4, seed=3)
THINK_CONVERSATION = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nhi"},
    {"role": "user", "content": "Again."},
    {"role": "assistant", "content": "<think>\nOnce more.\n</think>\n\nhi again"},
]


@pytest.fixture(scope="session")
def calc_engine(qwen_tokenizer):
    """A policy that solves CALC_ROWS with three tool-using turns (compact JSON calls)."""
    model = build_tiny_model(qwen_tokenizer, hidden_size=64, num_layers=2)
    conversations = [expert_conversation(r) for r in CALC_ROWS]
    supervised_warm_start(
        model, qwen_tokenizer, conversations, tools=to_openai_tools([calculator]),
        steps=80, lr=1e-2, progress=False,
    )
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
