"""Gateway fixtures: real TorchEngines on tiny Qwen-vocabulary models, and a recording proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import (
    build_qwen_tokenizer,
    build_tiny_model,
    cached_build,
    load_pretrained_pair,
    save_pretrained_pair,
    supervised_warm_start,
)
from examples.calculator.agent import calculator, expert_conversation
from tests.rollout.conftest import CALC_ROWS

__all__ = ["CALC_ROWS", "RecordingEngine", "calc_model_dir"]

CALC_RECIPE = {"hidden_size": 64, "num_layers": 2, "steps": 80, "lr": 1e-2, "rows": "4/3"}
"""The policy of tests/rollout's calc_engine, cached on disk so each test folder that needs
it loads it instead of warm-starting it again."""


def calc_model_dir() -> Path:
    """A tiny Qwen-vocabulary policy that solves CALC_ROWS with three tool-using turns."""

    def build(folder: Path) -> None:
        tokenizer = build_qwen_tokenizer("hermes")
        model = build_tiny_model(tokenizer, hidden_size=CALC_RECIPE["hidden_size"],
                                 num_layers=CALC_RECIPE["num_layers"])
        supervised_warm_start(
            model, tokenizer, [expert_conversation(r) for r in CALC_ROWS],
            tools=to_openai_tools([calculator]), steps=CALC_RECIPE["steps"],
            lr=CALC_RECIPE["lr"], progress=False,
        )
        save_pretrained_pair(model, tokenizer, folder)

    return cached_build("gateway-calc", CALC_RECIPE, build)


@pytest.fixture(scope="session")
def calc_engine():
    """The calculator policy on a TorchEngine."""
    model, _ = load_pretrained_pair(calc_model_dir())
    engine = TorchEngine(model)
    yield engine
    engine.close()


class RecordingEngine:
    """Forwards to a real engine and keeps every prompt and result, in arrival order."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.prompts: list[list[int]] = []
        self.results = []
        # (prompt, result) as each call returns: concurrent calls that finish in one decode
        # step may return in any order, so pair them here rather than by position.
        self.answered: list[tuple[list[int], object]] = []

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        self.prompts.append(list(prompt_ids))
        result = await self.engine.generate(prompt_ids, sampling, request_id)
        self.results.append(result)
        self.answered.append((list(prompt_ids), result))
        return result


@pytest.fixture(scope="session")
def random_engine(qwen_tokenizer):
    """An untrained tiny policy: cheap, answers with random text."""
    engine = TorchEngine(build_tiny_model(qwen_tokenizer, hidden_size=32, num_layers=1),
                         tokenizer=qwen_tokenizer)
    yield engine
    engine.close()
