"""Several policies as named LoRA adapters of one TorchEngine: each request is served by its own
adapter in one continuous batch (rows of two adapters and the base share a decode step), an
adapter push changes that adapter's output only, an adapter row's logprobs are PEFT's, and an
`AdapterView` tags its requests and versions."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.adapter_view import AdapterView
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import hf_greedy, id_model

PROMPTS = [[5, 17, 301, 42, 9], [7, 7, 100], [400, 3, 3, 8, 12, 250, 31]]
N = 8


def greedy(adapter: str | None = None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=N, adapter=adapter)


def peft_adapter(base, seed: int, name: str):
    """A PEFT model of ``base`` with one random (nonzero-B) LoRA, and its push named ``name``."""
    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))  # fmt: skip
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lora_B" in key:
                p.normal_(0, 0.5)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model.eval(), AdapterWeights(state, scaling=2.0, name=name)


@pytest.fixture(scope="module")
def base():
    return id_model(0)


@pytest.fixture(scope="module")
def adapters(base):
    return {"a": peft_adapter(base, 1, "a"), "b": peft_adapter(base, 2, "b")}


def peft_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1)


async def test_mixed_batch_serves_each_row_its_adapter(base, adapters):
    engine = TorchEngine(copy.deepcopy(base))
    try:
        await engine.load_weights(adapters["a"][1], 1)
        await engine.load_weights(adapters["b"][1], 2)
        assert engine.policy_version == 2
        names = [None, "a", "b"]
        alone = {}
        for name in names:  # each alone, one request at a time
            for i, prompt in enumerate(PROMPTS):
                alone[name, i] = await engine.generate(
                    prompt, greedy(name), f"{name}{i}"
                )
        # All nine at once: rows of the base and both adapters prefill and decode together.
        mixed = await asyncio.gather(*(
            engine.generate(p, greedy(n), f"m{n}{i}") for n in names for i, p in enumerate(PROMPTS)
        ))  # fmt: skip
        for (name, i), got in zip(
            [(n, i) for n in names for i in range(3)], mixed, strict=True
        ):
            want = alone[name, i]
            assert got.token_ids == want.token_ids
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
            # versions: the base's rows were served by version 0, each adapter's by its push
            assert got.policy_version == {None: 0, "a": 1, "b": 2}[name]
        for i, prompt in enumerate(PROMPTS):
            assert alone[None, i].token_ids == hf_greedy(
                base, prompt, N
            )  # the base is exact
            for name in ("a", "b"):
                model = adapters[name][0]
                got = alone[name, i]
                assert got.token_ids == hf_greedy(model, prompt, N)
                want = peft_logprobs(model, prompt, got.token_ids)
                assert torch.allclose(torch.tensor(got.logprobs), want, atol=1e-5)
        assert alone["a", 0].token_ids != alone["b", 0].token_ids
    finally:
        engine.close()


async def test_adapter_push_changes_that_policy_only(base, adapters):
    engine = TorchEngine(copy.deepcopy(base))
    try:
        a, b = AdapterView(engine, "a"), AdapterView(engine, "b")
        frozen = AdapterView(engine, None)
        await a.load_weights(adapters["a"][1], 1)
        await b.load_weights(adapters["b"][1], 2)
        assert (a.policy_version, b.policy_version, frozen.policy_version) == (1, 2, 0)

        async def outputs():
            views = {"a": a, "b": b, None: frozen}
            return {n: [(await v.generate(p, greedy(), "r")).token_ids for p in PROMPTS]
                    for n, v in views.items()}  # fmt: skip

        before = await outputs()
        _, new_a = peft_adapter(base, 3, "a")
        await a.load_weights(new_a, 3)
        assert a.policy_version == 3 and b.policy_version == 2
        after = await outputs()
        assert after["a"] != before["a"]
        assert after["b"] == before["b"] and after[None] == before[None]
        got = await b.generate(PROMPTS[0], greedy(), "v")
        assert got.policy_version == 2  # b's tokens keep b's version across a's push

        with pytest.raises(EngineError, match="does not hold"):
            await engine.generate(PROMPTS[0], greedy("nope"), "x")
        with pytest.raises(EngineError, match="got a push of adapter 'b'"):
            await a.load_weights(adapters["b"][1], 4)
        with pytest.raises(EngineError, match="frozen"):
            await a.load_weights(StateDict(base.state_dict()), 4)
        assert (a.policy_version, b.policy_version) == (3, 2)  # refused pushes change nothing
    finally:
        engine.close()


async def test_adapter_push_reprefills_only_its_rows(base, adapters):
    """A push of adapter a while rows of a and b decode: a's rows finish on the new adapter
    (their later tokens carry the new version), b's keep their cache and version."""
    engine = TorchEngine(copy.deepcopy(base))
    try:
        await engine.load_weights(adapters["a"][1], 1)
        await engine.load_weights(adapters["b"][1], 2)
        long = SamplingParams(temperature=0.0, max_tokens=64)
        await engine.pause()
        rows = [asyncio.ensure_future(engine.generate(PROMPTS[0], long.model_copy(
            update={"adapter": n}), n)) for n in ("a", "b")]  # fmt: skip
        await asyncio.sleep(0.05)
        await engine.resume()
        await asyncio.sleep(0.02)
        _, new_a = peft_adapter(base, 3, "a")
        await engine.load_weights(new_a, 3)
        assert engine.policy_version == 3
        got_a, got_b = await asyncio.gather(*rows)
        assert got_b.token_versions is None and got_b.policy_version == 2
        assert got_a.policy_version == 3
        if got_a.token_versions is not None:  # the push landed mid-decode
            assert set(got_a.token_versions) == {1, 3}
    finally:
        engine.close()


async def test_a_rebuilt_pool_replica_rejoins_with_every_named_adapter(base, adapters):
    """A replica rebuilt after adapter pushes rejoins on the next push of one adapter holding
    the other one too, so every policy's requests can land on it."""
    from agentrl_sdk.engines import EnginePool

    pool = EnginePool([TorchEngine(copy.deepcopy(base)) for _ in range(2)],
                      restart=lambda i: TorchEngine(copy.deepcopy(base)), max_restarts=1)  # fmt: skip
    try:
        await pool.load_weights(adapters["a"][1], 1)
        await pool.load_weights(adapters["b"][1], 2)
        pool.replicas[1].close()
        await pool.check_health()
        for _ in range(200):
            if not pool.restarting:
                break
            await asyncio.sleep(0.05)
        assert pool.healthy == [0]  # rebuilt on the bare base: waits for the next push
        _, new_a = peft_adapter(base, 3, "a")
        await pool.load_weights(new_a, 3)
        assert pool.healthy == [0, 1]
        assert [r.policy_version for r in pool.replicas] == [3, 3]
        rebuilt = pool.replicas[1]
        got = await rebuilt.generate(PROMPTS[0], greedy("b"), "b-on-rebuilt")
        assert got.token_ids == hf_greedy(adapters["b"][0], PROMPTS[0], N)
        assert got.policy_version == 2  # b as the driver pushed it
    finally:
        pool.close()
