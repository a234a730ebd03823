"""VLLMEngine with ``enable_lora`` on a real vLLM(-CPU): an adapter push is served as a vLLM LoRA
with the greedy ids of a TorchEngine serving the merged weights and their logprobs; full
weights drop it. Named adapters (several policies on one base): each request is served by its
own adapter or the base, with the TorchEngine's ids and versions, and a push changes only that
adapter's output. One engine for the module (start-up ~45 s)."""

from __future__ import annotations

import asyncio
import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import tiny_model_dir
from tests.engines.test_lora_weights import peft_adapter
from tests.engines.test_row_adapters import peft_adapter as named_peft_adapter

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


@pytest.fixture(scope="module")
def base():
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(0), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine():
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(
        tiny_model_dir(0), max_batch_size=8, max_model_len=512, eos_token_ids=[],
        engine_args={"enable_lora": True, "max_lora_rank": 8},  # max_loras: the default
    )  # fmt: skip
    yield engine
    engine.close()


async def test_adapter_push_serves_the_merged_model(engine, base):
    model, adapter = peft_adapter(base)
    merged = TorchEngine(copy.deepcopy(model).merge_and_unload(), eos_token_ids=[])  # greedy ids
    v = engine.policy_version
    try:
        assert engine.weight_intake.kinds == frozenset(
            {"state_dict", "shared_files", "collective", "adapter"})  # fmt: skip
        before = [a.token_ids for a in await answers(engine, GREEDY)]
        await engine.load_weights(adapter, v + 1)
        assert engine.policy_version == v + 1
        got, want = await answers(engine, GREEDY), await answers(merged, GREEDY)
        merged_ids = [a.token_ids for a in want]
        assert [a.token_ids for a in got] == merged_ids != before
        assert all(a.policy_version == v + 1 for a in got)
        for prompt, sampled in zip(PROMPTS, await answers(engine, SAMPLED), strict=True):
            want = hf_logprobs(merged.model, prompt, sampled.token_ids)
            assert sampled.logprobs == pytest.approx(want, abs=LOGPROB_TOL)

        too_big = {k: torch.cat([v] * 4, dim=0 if "lora_A" in k else 1)
                   for k, v in adapter.tensors.items()}  # rank 16 > max_lora_rank  # fmt: skip
        with pytest.raises(EngineError, match="refused the adapter"):
            await engine.load_weights(AdapterWeights(too_big, adapter.scaling), v + 2)
        assert engine.policy_version == v + 1
        with pytest.raises(EngineError, match="cannot be served together"):
            await engine.load_weights(named_peft_adapter(base, 1, "a")[1], v + 2)
        assert engine.policy_version == v + 1
        # The refused pushes left the adapter serving.
        assert [a.token_ids for a in await answers(engine, GREEDY)] == merged_ids

        await engine.load_weights(StateDict(base.state_dict()), v + 2)  # the adapter goes
        assert engine.policy_version == v + 2
        assert [a.token_ids for a in await answers(engine, GREEDY)] == before
    finally:
        merged.close()


async def outputs(engine, names=(None, "a", "b")):
    """Greedy answers by (adapter, prompt), all requests at once: they share vLLM's batches."""
    keys = [(n, i) for n in names for i in range(len(PROMPTS))]
    got = await asyncio.gather(*(engine.generate(
        PROMPTS[i], GREEDY.model_copy(update={"adapter": n}), f"{n}-{i}") for n, i in keys))  # fmt: skip
    return dict(zip(keys, got, strict=True))


def ids(answers, name):
    return [a.token_ids for (n, _), a in answers.items() if n == name]


async def test_named_adapters_serve_each_request_its_own(engine, base):
    """Base and two named adapters in one engine: the TorchEngine's greedy ids per adapter,
    the PEFT model's logprobs, per-adapter versions; a push to a changes a's output only,
    held requests of b keep b's version, and named adapters stay over new base weights."""
    peft = {n: named_peft_adapter(base, seed, n) for n, seed in (("a", 1), ("b", 2), ("a2", 3))}
    new_a = AdapterWeights(peft["a2"][1].tensors, peft["a2"][1].scaling, name="a")
    torch_engine = TorchEngine(copy.deepcopy(base), eos_token_ids=[])
    v = engine.policy_version
    try:
        for name, version in (("a", v + 1), ("b", v + 2)):
            await torch_engine.load_weights(peft[name][1], version)
            await engine.load_weights(peft[name][1], version)
            assert engine.policy_version == torch_engine.policy_version == version
        got, want = await outputs(engine), await outputs(torch_engine)
        for name in (None, "a", "b"):
            assert ids(got, name) == ids(want, name)
        assert len({str(ids(got, n)) for n in (None, "a", "b")}) == 3
        assert {n: a.policy_version for (n, _), a in got.items()} == {
            None: v, "a": v + 1, "b": v + 2}  # fmt: skip
        for name in ("a", "b"):  # engine logprobs = the PEFT model's, per adapter
            sampled = SAMPLED.model_copy(update={"adapter": name})
            for i, prompt in enumerate(PROMPTS):
                answer = await engine.generate(prompt, sampled, f"s{name}{i}")
                want_lp = hf_logprobs(peft[name][0], prompt, answer.token_ids)
                assert answer.logprobs == pytest.approx(want_lp, abs=LOGPROB_TOL)

        # Push a while long requests of a and b are in flight: both are held and resubmitted.
        long = {n: GREEDY.model_copy(update={"adapter": n, "max_tokens": 480}) for n in "ab"}
        alone_b = await engine.generate(PROMPTS[0], long["b"], "alone-b")
        resubmitted = engine._requests.resubmissions
        rows = {n: asyncio.ensure_future(engine.generate(PROMPTS[0], long[n], f"long-{n}"))
                for n in "ab"}  # fmt: skip
        while engine.in_flight < 2 or engine._requests.tokens_in_flight() < 16:
            await asyncio.sleep(0.005)
        await engine.load_weights(new_a, v + 3)
        assert engine.policy_version == v + 3
        long_a, long_b = await rows["a"], await rows["b"]
        assert engine._requests.resubmissions - resubmitted == 2  # held, then resumed
        assert long_b.policy_version == v + 2 and long_b.token_versions is None
        assert long_b.token_ids == alone_b.token_ids  # resubmitted on the same adapter
        assert long_a.policy_version == v + 3 and set(long_a.token_versions) == {v + 1, v + 3}

        after = await outputs(engine)
        await torch_engine.load_weights(new_a, v + 3)
        assert ids(after, "a") == ids(await outputs(torch_engine, ["a"]), "a") != ids(got, "a")
        assert ids(after, "b") == ids(got, "b") and ids(after, None) == ids(got, None)
        assert {n: a.policy_version for (n, _), a in after.items()} == {
            None: v, "a": v + 3, "b": v + 2}  # fmt: skip

        with pytest.raises(EngineError, match="does not hold"):
            await engine.generate(PROMPTS[0], GREEDY.model_copy(update={"adapter": "c"}), "c")
        with pytest.raises(EngineError, match="cannot be served together"):
            await engine.load_weights(peft_adapter(base)[1], v + 4)  # unnamed beside named ones
        assert engine.policy_version == v + 3

        await engine.load_weights(StateDict(base.state_dict()), v + 4)  # named ones stay
        assert engine.policy_version == v + 4
        again = await outputs(engine)
        assert all(ids(again, n) == ids(after, n) for n in (None, "a", "b"))
        assert {a.policy_version for a in again.values()} == {v + 4}
    finally:
        torch_engine.close()
