"""LoRA adapters on the TorchEngine: merged_weight is PEFT's merge to the bit, an adapter push
serves base + adapter (greedy ids of HF on the merged model), each version merges from the
base (never stacked), and a bad adapter leaves the weights as they were; a pool pushes it to
every replica as one version, and a RayEngine to the engine in its actor."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from agentrl_sdk.engines import EnginePool, TorchEngine
from agentrl_sdk.engines import Engine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights, merged_weight
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import hf_greedy, id_model, tiny_model_dir

PROMPT = [5, 17, 301, 42, 9]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
KEY = "model.layers.1.self_attn.q_proj.weight"


def peft_adapter(base, scale: float = 1.0):
    """A PEFT LoRA on ``base`` with nonzero B (a fresh adapter is a no-op); the PEFT model
    and its adapter as pushed."""
    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5 * scale)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model.eval(), AdapterWeights(state, scaling=8 / 4)


@pytest.fixture(scope="module")
def base():
    return id_model(0)


def test_merged_weight_is_peft_merge_and_adapter_pairs(base):
    model, adapter = peft_adapter(base)
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    (lora_a, lora_b) = adapter.by_weight()[KEY]
    assert torch.equal(merged_weight(base.state_dict()[KEY], lora_a, lora_b, 2.0), merged[KEY])
    assert len(adapter.by_weight()) == 4  # q and v of two layers
    half = dict(list(adapter.tensors.items())[:1])
    with pytest.raises(ValueError, match="lacks lora_A or lora_B"):
        AdapterWeights(half, 2.0).by_weight()
    with pytest.raises(ValueError, match="not a LoRA A/B key"):
        AdapterWeights({"model.embed_tokens.weight": torch.zeros(1)}, 2.0).by_weight()


async def test_adapter_push_serves_base_plus_adapter_from_the_base(base):
    engine = TorchEngine(copy.deepcopy(base))
    assert isinstance(engine, Engine) and engine.weight_intake.takes("adapter")
    try:
        model, adapter = peft_adapter(base)
        loaded = engine.model.state_dict()[KEY]
        await engine.load_weights(adapter, 1)
        assert engine.policy_version == 1
        # The base is kept as loaded, not copied, and never written: merges replace it.
        assert engine._lora_base[KEY].data_ptr() == loaded.data_ptr()
        assert torch.equal(loaded, base.state_dict()[KEY])
        merged = copy.deepcopy(model).merge_and_unload()
        served = engine.model.state_dict()
        assert all(torch.equal(served[k], v) for k, v in merged.state_dict().items())
        got = await engine.generate(PROMPT, GREEDY, "a")
        assert got.token_ids == hf_greedy(merged, PROMPT, 8) != hf_greedy(base, PROMPT, 8)
        assert got.policy_version == 1

        # The next version merges into the base again, not into version 1's weights.
        _, stronger = peft_adapter(base, scale=2.0)
        await engine.load_weights(stronger, 2)
        assert engine.policy_version == 2
        lora_a, lora_b = stronger.by_weight()[KEY]
        want = merged_weight(base.state_dict()[KEY], lora_a, lora_b, 2.0)
        assert torch.equal(engine.model.state_dict()[KEY], want)

        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        bad = AdapterWeights({"base_model.model.nope.lora_A.weight": torch.zeros(4, 64),
                              "base_model.model.nope.lora_B.weight": torch.zeros(64, 4)}, 2.0)
        with pytest.raises(EngineError, match="weights unchanged.*nope"):
            await engine.load_weights(bad, 3)
        assert engine.policy_version == 2
        assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())

        # Full weights replace the base the next adapter merges into.
        await engine.load_weights(StateDict(merged.state_dict()), 3)
        assert engine.policy_version == 3
        await engine.load_weights(adapter, 4)
        assert engine.policy_version == 4
        lora_a, lora_b = adapter.by_weight()[KEY]
        want = merged_weight(merged.state_dict()[KEY], lora_a, lora_b, 2.0)
        assert torch.equal(engine.model.state_dict()[KEY], want)
    finally:
        engine.close()


async def test_pool_pushes_the_adapter_to_every_replica_as_one_version(base):
    model, adapter = peft_adapter(base)
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    pool = EnginePool([TorchEngine(copy.deepcopy(base)) for _ in range(2)])
    try:
        assert pool.weight_intake.takes("adapter") and isinstance(pool, Engine)
        await pool.load_weights(adapter, 1)
        assert pool.policy_version == 1
        assert [r.policy_version for r in pool.replicas] == [1, 1]
        for replica in pool.replicas:
            served = replica.model.state_dict()
            assert all(torch.equal(served[k], v) for k, v in merged.items())
    finally:
        pool.close()


@pytest.mark.slow
async def test_ray_engine_forwards_adapter_pushes():
    import ray

    from agentrl_sdk.engines.ray import RayEngine
    from agentrl_sdk.trainer import TrainerConfig, init_ray

    started = init_ray(TrainerConfig())
    path = tiny_model_dir(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model, adapter = peft_adapter(base)
    local = TorchEngine(copy.deepcopy(model).merge_and_unload())
    remote = RayEngine("torch", str(path))
    try:
        assert remote.weight_intake.takes("adapter")
        await remote.load_weights(adapter, 1)
        assert remote.policy_version == 1
        got = await remote.generate(PROMPT, GREEDY, "remote")
        assert got.token_ids == (await local.generate(PROMPT, GREEDY, "local")).token_ids
        assert got.policy_version == 1
    finally:
        remote.close()
        local.close()
        if started:
            ray.shutdown()
