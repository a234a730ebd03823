"""sdk.train with trainer.lora on the demo agent: the adapters train, pushes carry the adapter
only, the checkpoint holds adapters only, and final_model is a normal (merged) HF folder."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

import agentrl_sdk as sdk
from agentrl_sdk.entrypoints import resolve_entrypoints
from agentrl_sdk.trainer import LoraConfig
from tests.pipeline._demo import demo_config

pytestmark = pytest.mark.slow


def _weights(path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).state_dict()


def test_sdk_train_with_lora(trained, tmp_path, caplog):
    config = demo_config(2, in_process=True)
    config.checkpoint.dir = str(tmp_path / "checkpoints")
    lora = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"], sync="adapter")
    config.trainer = config.trainer.model_copy(update={"lora": lora, "lr": 1e-2})
    job = resolve_entrypoints(config)
    caplog.set_level(logging.INFO, logger="agentrl_sdk.trainer.weight_sync")

    result = sdk.train(job.graph, job.dataset, reward=job.reward, config=config,
                       input_fn=job.input_fn)

    assert result.steps == 2 and set(trained) == {0, 1}
    pushes = [r.getMessage() for r in caplog.records if "weight sync v" in r.getMessage()]
    assert pushes and all("(adapter)" in m for m in pushes)
    full = sum(t.numel() * t.element_size() for t in _weights(config.model.path).values())
    pushed = [m["weight_sync/bytes"] for m in result.history if "weight_sync/bytes" in m]
    assert pushed and all(0 < b < 0.05 * full for b in pushed)  # the adapter, not the model
    saved = FileSystemReader(str(Path(result.checkpoint) / "dcp")).read_metadata()
    model_keys = [k for k in saved.state_dict_metadata if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    base, final = _weights(config.model.path), _weights(result.final_model)
    assert final.keys() == base.keys()  # a plain HF folder: no PEFT names
    moved = {k for k in base if not torch.equal(base[k], final[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved)
