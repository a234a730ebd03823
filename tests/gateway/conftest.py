"""Gateway fixtures: real TorchEngines on tiny Qwen-vocabulary models, and a recording proxy."""

from __future__ import annotations

import pytest

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import build_tiny_model
from tests.rollout.conftest import CALC_ROWS, calc_engine  # noqa: F401 - shared fixture

__all__ = ["CALC_ROWS", "RecordingEngine"]


class RecordingEngine:
    """Forwards to a real engine and keeps every prompt and result, in arrival order."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.prompts: list[list[int]] = []
        self.results = []

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids, sampling, request_id):
        self.prompts.append(list(prompt_ids))
        result = await self.engine.generate(prompt_ids, sampling, request_id)
        self.results.append(result)
        return result


@pytest.fixture(scope="session")
def random_engine(qwen_tokenizer):
    """An untrained tiny policy: cheap, answers with random text."""
    engine = TorchEngine(build_tiny_model(qwen_tokenizer, hidden_size=32, num_layers=1))
    yield engine
    engine.close()
