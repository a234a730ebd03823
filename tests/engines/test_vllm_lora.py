"""VLLMEngine with ``enable_lora`` on a real vLLM(-CPU): an adapter push is served as a vLLM LoRA
with the greedy ids of a TorchEngine serving the merged weights and their logprobs; full
weights drop it."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.lora_weights import AdapterWeights
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from tests.engines._tiny import tiny_model_dir
from tests.engines.test_lora_weights import peft_adapter

if os.environ.get("AGENTRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

PROMPTS = [[5, 17, 301, 42, 9], [800, 3, 3, 61]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
SAMPLED = SamplingParams(temperature=1.0, max_tokens=24, seed=7)
LOGPROB_TOL = 1e-4


def hf_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """One forward over prompt + response: each response token's logprob (temperature 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


async def answers(engine, params):
    return [await engine.generate(p, params, f"r{i}") for i, p in enumerate(PROMPTS)]


async def test_adapter_push_serves_the_merged_model():
    from agentrl_sdk.engines.vllm_engine import VLLMEngine

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(0), dtype=torch.float32).eval()
    model, adapter = peft_adapter(base)
    merged = TorchEngine(copy.deepcopy(model).merge_and_unload(), eos_token_ids=[])  # greedy ids
    engine = VLLMEngine(
        tiny_model_dir(0), max_batch_size=8, max_model_len=512, eos_token_ids=[],
        engine_args={"enable_lora": True, "max_lora_rank": 8, "max_loras": 1},
    )  # fmt: skip
    try:
        assert engine.takes_adapters
        before = [a.token_ids for a in await answers(engine, GREEDY)]
        assert await engine.update_adapter(adapter) == 1
        got, want = await answers(engine, GREEDY), await answers(merged, GREEDY)
        assert [a.token_ids for a in got] == [a.token_ids for a in want] != before
        assert all(a.policy_version == 1 for a in got)
        for prompt, sampled in zip(PROMPTS, await answers(engine, SAMPLED), strict=True):
            want = hf_logprobs(merged.model, prompt, sampled.token_ids)
            assert sampled.logprobs == pytest.approx(want, abs=LOGPROB_TOL)

        too_big = {k: torch.cat([v] * 4, dim=0 if "lora_A" in k else 1)
                   for k, v in adapter.tensors.items()}  # rank 16 > max_lora_rank  # fmt: skip
        with pytest.raises(EngineError, match="refused the adapter"):
            await engine.update_adapter(AdapterWeights(too_big, adapter.scaling))
        assert engine.policy_version == 1

        assert await engine.update_weights(base.state_dict()) == 2  # the adapter goes
        assert [a.token_ids for a in await answers(engine, GREEDY)] == before
    finally:
        engine.close()
        merged.close()
