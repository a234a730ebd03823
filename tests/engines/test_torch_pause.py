"""TorchEngine pause/resume: held requests keep their partial output and finish as one answer."""

from __future__ import annotations

import asyncio
import copy

import pytest
from transformers import PreTrainedModel

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import hf_greedy, id_model

LONG = SamplingParams(temperature=0.0, max_tokens=120)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return id_model(0)


PROMPT = [5, 17, 99, 3, 250, 7]


def _generated(engine: TorchEngine) -> int:
    """Tokens decoded so far by the running requests (read from the engine thread's batch)."""
    return sum(len(row.token_ids) for row in list(engine._scheduler._batch.rows))


async def _paused_midway(engine: TorchEngine, prompt: list[int]) -> asyncio.Future[GenerateResult]:
    """Start a long request and pause once it has decoded some tokens (but not all)."""
    running = asyncio.ensure_future(engine.generate(prompt, LONG, "long"))
    while not running.done() and _generated(engine) < 20:
        await asyncio.sleep(0.001)
    await engine.pause()
    assert not running.done()
    return running


async def test_pause_resume_equals_an_uninterrupted_greedy_run(model) -> None:
    engine = TorchEngine(model, eos_token_ids=())
    try:
        running = await _paused_midway(engine, PROMPT)
        # Paused: nothing decodes, a new request waits instead of failing.
        waiting = asyncio.ensure_future(engine.generate(PROMPT[:3], LONG.model_copy(
            update={"max_tokens": 5}), "new"))  # fmt: skip
        await asyncio.sleep(0.2)
        assert not running.done() and not waiting.done()
        await engine.resume()
        result, short = await asyncio.wait_for(asyncio.gather(running, waiting), 60)
    finally:
        engine.close()
    assert result.token_ids == hf_greedy(model, PROMPT, LONG.max_tokens)
    assert result.token_versions is None and result.versions == [0] * LONG.max_tokens
    assert short.token_ids == hf_greedy(model, PROMPT[:3], 5)


async def test_weights_updated_while_paused_take_over_the_held_request(model) -> None:
    engine = TorchEngine(copy.deepcopy(model), eos_token_ids=())
    new_model = id_model(seed=1)
    try:
        running = await _paused_midway(engine, PROMPT)
        await engine.load_weights(StateDict(new_model.state_dict()), 1)
        assert engine.policy_version == 1
        await engine.resume()
        result = await asyncio.wait_for(running, 60)
    finally:
        engine.close()
    k = result.versions.count(0)
    assert 0 < k < LONG.max_tokens
    assert result.versions == [0] * k + [1] * (LONG.max_tokens - k)
    assert result.policy_version == 1
    head, tail = result.token_ids[:k], result.token_ids[k:]
    # Old weights wrote the head; the new weights continued from prompt + head.
    assert head == hf_greedy(model, PROMPT, k)
    assert tail == hf_greedy(new_model, PROMPT + head, LONG.max_tokens - k)
