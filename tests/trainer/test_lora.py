"""LoRA on the trainer group (gloo, CPU): updates on 1 and 2 ranks equal PEFT in one process,
checkpoints hold adapters only and resume exactly, merged weights reach the engines with exact
logprobs, and both exports (merged, adapter folder) generate what base + adapter generates.

Group L (2 ranks) runs steps 1-2, a checkpoint, step 3; the tests read its recorded states.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from peft import PeftModel, get_peft_model, get_peft_model_state_dict

from agentrl_sdk.engines.torch.engine import TorchEngine
from agentrl_sdk.trainer import LoraConfig, TrainerGroup, WeightSync
from agentrl_sdk.trainer.lora import peft_config
from agentrl_sdk.types import Batch, Sample, SamplingParams
from tests.trainer.test_trainer_group import (
    BATCHES,
    CONFIG_A,
    CONFIG_C,
    LOSS_A,
    LOSS_C,
    TOL,
    Reference,
    full_state,
    load_model,
    max_diff,
    teach,
)

pytestmark = pytest.mark.slow

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
CONFIG_L = CONFIG_A.model_copy(update={"lora": LORA, "lr": 1e-2})
CONFIG_L1 = CONFIG_C.model_copy(
    update={"lora": LoraConfig(rank=2, alpha=4.0, sync="adapter"), "lr": 1e-2}
)


class PeftReference(Reference):
    """The full-fine-tune reference, its policy wrapped by PEFT's `get_peft_model`."""

    def __init__(self, model_path, cfg, lc):
        super().__init__(model_path, cfg, lc)  # the KL reference stays the plain base
        torch.manual_seed(cfg.seed)  # the trainer initialises adapters from the seed alone
        self.model = get_peft_model(self.model, peft_config(cfg.lora)).eval()
        self.opt = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas,
            eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
        )  # fmt: skip

    def adapter(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def merged(self) -> dict[str, torch.Tensor]:
        return copy.deepcopy(self.model).merge_and_unload().state_dict()


async def sampled_logprobs(engine, group, config) -> tuple[list[float], list[float]]:
    """A response sampled at the trainer's temperature: the engine's logprobs, the trainer's."""
    prompt = [5, 99, 310, 7]
    params = SamplingParams(temperature=config.temperature, max_tokens=12, seed=3)
    sampled = await engine.generate(prompt, params, "sampled")
    n = len(sampled.token_ids)
    sample = Sample(
        row_id="x", sample_index=0, prompt_ids=prompt, response_ids=sampled.token_ids,
        response_mask=[1] * n, old_logprobs=sampled.logprobs, token_advantages=[0.0] * n,
    )  # fmt: skip
    return sampled.logprobs, group.compute_logprobs(Batch(samples=[sample]))[0]


@pytest.fixture(scope="module")
def scenario_l(ray_session, model_path, tmp_path_factory):
    """Group L: steps 1-2, checkpoint, step 3; adapters, merged weights and metrics per step."""
    ckpt = tmp_path_factory.mktemp("lora_ckpt") / "step2"
    group = TrainerGroup(model_path, CONFIG_L, LOSS_A)
    adapters, merged, metrics = [], [], []
    try:
        for i, batch in enumerate(BATCHES):
            if i == 2:
                group.save_checkpoint(ckpt, extra={"next_row": 12})
            metrics.append(group.update(batch))
            adapters.append(group.weights.adapter_state_dict())
            merged.append(full_state(group))
        yield {"group": group, "adapters": adapters, "merged": merged, "metrics": metrics,
               "ckpt": ckpt}  # fmt: skip
    finally:
        group.shutdown()


def test_two_ranks_match_peft_reference(scenario_l, model_path):
    reference = PeftReference(model_path, CONFIG_L, LOSS_A)
    trained = sum(p.numel() for p in reference.model.parameters() if p.requires_grad)
    assert scenario_l["group"].info["trained_params"] == trained
    for step in range(2):
        expected = reference.update(BATCHES[step].samples)
        got = scenario_l["metrics"][step]
        assert max_diff(scenario_l["adapters"][step], reference.adapter()) < TOL
        assert max_diff(scenario_l["merged"][step], reference.merged()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    assert scenario_l["metrics"][1]["kl"] > 0  # the reference is the base, adapters disabled
    base = load_model(model_path).state_dict()
    moved = {k for k in base if not torch.equal(base[k], scenario_l["merged"][1][k])}
    assert moved == {f"model.layers.{i}.{m}.weight" for i in range(2)
                     for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")}  # fmt: skip


async def test_one_rank_matches_peft_reference_and_adapter_push_equals_merged(
    ray_session, model_path
):
    """Micro-batched, two mini-batches; then the engine merges the pushed adapter into exactly
    the weights a merged push sends, for a fraction of the bytes."""
    reference = PeftReference(model_path, CONFIG_L1, LOSS_C)
    engine = TorchEngine.from_pretrained(model_path)
    try:
        with TrainerGroup(model_path, CONFIG_L1, LOSS_C) as group:
            for step in range(2):
                got = group.update(BATCHES[step])
                expected = reference.update(BATCHES[step].samples)
                assert max_diff(group.weights.adapter_state_dict(), reference.adapter()) < TOL
                assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
            assert got["optimizer_steps"] == 4
            sync = WeightSync()
            await sync.push(group.weights, [engine], 1)
            assert engine.policy_version == 1
            merged = full_state(group)
            engine_logp, trainer_logp = await sampled_logprobs(engine, group, CONFIG_L1)
        assert trainer_logp == pytest.approx(engine_logp, abs=1e-4)
        served = engine.model.state_dict()
        assert sync.last_stats.adapter
        assert all(torch.equal(served[k], merged[k]) for k in merged)
        unique = {id(t): t for t in merged.values()}.values()
        full_bytes = sum(t.numel() * t.element_size() for t in unique)
        print(f"\nadapter push {sync.last_stats.bytes} B vs full {full_bytes} B "
              f"({sync.last_stats.bytes / full_bytes:.4f})")  # fmt: skip
        assert sync.last_stats.bytes < 0.05 * full_bytes
    finally:
        engine.close()


def test_checkpoint_holds_adapters_only_and_resume_is_exact(scenario_l, model_path):
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(scenario_l["ckpt"] / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    assert any(k.startswith("optimizer.state.") and ".lora_" in k for k in saved)
    with TrainerGroup(model_path, CONFIG_L, LOSS_A) as fresh:
        assert fresh.load_checkpoint(scenario_l["ckpt"]) == {"next_row": 12}
        assert max_diff(fresh.weights.adapter_state_dict(), scenario_l["adapters"][1]) == 0.0
        metrics = fresh.update(BATCHES[2])
        adapter = fresh.weights.adapter_state_dict()
    expected = scenario_l["metrics"][2]
    machine = ("time_s", "peak_rss_gb")
    assert {k: v for k, v in metrics.items() if k not in machine} == {
        k: v for k, v in expected.items() if k not in machine
    }
    assert all(torch.equal(adapter[k], scenario_l["adapters"][2][k]) for k in adapter)


async def test_merged_sync_keeps_engine_logprobs_exact_and_exports_agree(
    scenario_l, model_path, tmp_path
):
    """Runs last on group L: it teaches the group a token (its states are recorded above)."""
    group = scenario_l["group"]
    prompt, target = [17, 300, 42, 9, 512], 77
    greedy = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=())
    engine = TorchEngine.from_pretrained(model_path)
    try:
        before = (await engine.generate(prompt, greedy, "before")).token_ids
        teach(group, prompt, target, updates=10)
        sync = WeightSync(bucket_bytes=64 << 10)
        await sync.push(group.weights, [engine], 1)
        assert engine.policy_version == 1
        after = (await engine.generate(prompt, greedy, "after")).token_ids
        assert after[0] == target and after != before
        engine_logp, trainer_logp = await sampled_logprobs(engine, group, CONFIG_L)
        assert trainer_logp == pytest.approx(engine_logp, abs=1e-4)
    finally:
        engine.close()

    merged_dir = group.export_pretrained(tmp_path / "merged")
    adapter_dir = group.export_pretrained(tmp_path / "adapter", form="adapter")
    assert not any("lora" in k for k in load_model(merged_dir).state_dict())
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["target_modules"]
    exported = TorchEngine.from_pretrained(merged_dir)
    try:
        merged_ids = (await exported.generate(prompt, greedy, "exported")).token_ids
    finally:
        exported.close()
    peft_model = PeftModel.from_pretrained(load_model(model_path), adapter_dir).eval()
    with torch.no_grad():
        out = peft_model.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None,
            pad_token_id=0,
        )  # fmt: skip
    assert merged_ids == after == out[0, len(prompt):].tolist()
