"""Fixtures of the trainer-group tests: one Ray session and one tiny model folder per module."""

from __future__ import annotations

import pytest

from agentrl_sdk.models import build_small_tokenizer, build_tiny_model, save_pretrained_pair
from agentrl_sdk.trainer import TrainerConfig, init_ray


@pytest.fixture(scope="module")
def ray_session():
    import ray

    started = init_ray(TrainerConfig())  # as TrainerGroup starts it: workers not niced
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    tok = build_small_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2)
    return save_pretrained_pair(model, tok, tmp_path_factory.mktemp("trainer") / "model")
