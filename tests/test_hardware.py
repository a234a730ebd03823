"""``prefer-bfloat16`` resolves to bfloat16 only where the hardware multiplies it natively."""

from __future__ import annotations

import logging

import pytest
import torch

from agentrl_sdk import hardware
from agentrl_sdk.engines.factory import create_engine
from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.trainer.sharded_model import ShardedModel


@pytest.fixture
def native(monkeypatch):
    """Set whether bf16 is native here (restored after the test)."""

    def set_native(value: bool) -> None:
        monkeypatch.setattr(hardware, "bf16_is_native", lambda device="cpu": value)
        hardware._warn_emulated.cache_clear()

    return set_native


def test_prefer_bfloat16_is_bfloat16_only_where_native(native):
    native(True)
    assert hardware.resolve_dtype("prefer-bfloat16") == "bfloat16"
    native(False)
    assert hardware.resolve_dtype("prefer-bfloat16") == "float32"
    assert hardware.resolve_dtype("float32") == "float32"


def test_a_gpu_decides_for_the_engines_that_run_there(monkeypatch):
    """vLLM on a GPU whose host CPU lacks native bf16 still gets bfloat16."""
    monkeypatch.setattr(hardware, "bf16_is_native", lambda device="cpu": device == "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hardware.resolve_dtype("prefer-bfloat16", None) == "bfloat16"
    assert hardware.resolve_dtype("prefer-bfloat16", "cpu") == "float32"


def test_explicit_bfloat16_is_kept_with_one_warning_where_emulated(native, caplog):
    native(False)
    with caplog.at_level(logging.WARNING, logger="agentrl_sdk.hardware"):
        assert hardware.resolve_dtype("bfloat16") == "bfloat16"
        assert hardware.resolve_dtype("bfloat16") == "bfloat16"
    assert len(caplog.records) == 1 and "prefer-bfloat16" in caplog.text


def test_the_probe_agrees_with_onednn():
    assert hardware.bf16_is_native("cpu") == torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_an_engine_and_a_trainer_rank_take_the_setting(native):
    from tests.engines._tiny import tiny_model_dir

    folder = str(tiny_model_dir())
    native(False)
    engine = create_engine("torch", folder, dtype="prefer-bfloat16")
    try:
        assert engine.weight_intake.dtype == "float32"
    finally:
        engine.close()
    rank = ShardedModel(0, 1, folder, TrainerConfig(dtype="prefer-bfloat16"))
    assert rank._compute_dtype() == torch.float32
    native(True)
    assert rank._compute_dtype() == torch.bfloat16
    engine = create_engine("torch", folder, dtype="prefer-bfloat16")
    try:
        assert engine.weight_intake.dtype == "bfloat16"
    finally:
        engine.close()
