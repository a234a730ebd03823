"""Stop strings on the in-process vLLM engine: the same ids and finish as the torch engine."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoTokenizer

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.types import SamplingParams
from tests.engines._tiny import tiny_model_dir

# As in test_vllm_engine: CI sets AGENTRL_REQUIRE_VLLM so a missing vllm fails, not skips.
if os.environ.get("AGENTRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

PROMPT = [5, 17, 42, 99, 3, 250, 7]


async def test_vllm_and_torch_stop_at_the_same_token():
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    torch_engine = TorchEngine.from_pretrained(tiny_model_dir(0), dtype=torch.float32)
    vllm_engine = VLLMEngine(tiny_model_dir(0), max_batch_size=4, max_model_len=256)
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=(), seed=0)
        free = await torch_engine.generate(PROMPT, greedy, "free")
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(0))
        n = min(len(free.token_ids), 8)
        text = tokenizer.decode(free.token_ids[:n], skip_special_tokens=False)
        stop = text[len(tokenizer.decode(free.token_ids[: n // 2], skip_special_tokens=False)):]
        stopping = greedy.model_copy(update={"stop": (stop,)})
        by_torch = await torch_engine.generate(PROMPT, stopping, "t")
        by_vllm = await vllm_engine.generate(PROMPT, stopping, "v")
    finally:
        torch_engine.close()
        vllm_engine.close()
    assert len(tokenizer.encode(stop, add_special_tokens=False)) > 1
    assert by_torch.finish_reason == by_vllm.finish_reason == "stop"
    assert by_torch.token_ids == free.token_ids[: len(by_torch.token_ids)]
    assert by_vllm.token_ids == by_torch.token_ids
    assert stop in tokenizer.decode(by_vllm.token_ids, skip_special_tokens=False)
