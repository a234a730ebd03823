"""Parameters that never train are kept in the compute dtype (bf16): every trained value is
the one the float32-kept frozen weights give, at half their memory."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.algorithms import PolicyLossConfig
from agentrl_sdk.trainer import TrainerConfig
from agentrl_sdk.trainer import sharded_model
from agentrl_sdk.trainer.packing import FlatSamples
from agentrl_sdk.trainer.worker import PolicyWorker
from agentrl_sdk.tracing.server import free_port

from tests.trainer.test_trainer_group import BATCHES

CONFIG = TrainerConfig(world_size=1, lr=1e-3, dtype="bfloat16", trainable_layers=1,
                       micro_batch_tokens=20, cpu_threads=1)  # fmt: skip
LOSS = PolicyLossConfig(kl_coef=0.1)  # a reference model too: frozen through and through


def two_updates(model_path) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], int]:
    """Metrics of two updates in this process, the weights after them, and the bytes of the
    policy's and the reference's parameters."""
    threads = torch.get_num_threads()
    worker = PolicyWorker(0, 1, str(model_path), CONFIG, LOSS)
    try:
        worker.setup("127.0.0.1", free_port())
        metrics = [worker.update(FlatSamples.from_samples(b.samples)) for b in BATCHES[:2]]
        models = (worker.sharded.model, worker.sharded.ref_model)
        size = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
        state = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
                 for k, v in worker.sharded.model.state_dict().items()}  # fmt: skip
    finally:
        worker.close()
        torch.set_num_threads(threads)
    for m in metrics:
        m.pop("time_s", None), m.pop("peak_rss_gb", None)
    return metrics, state, size


def test_frozen_weights_in_bf16_change_no_trained_value(model_path, monkeypatch):
    kept, kept_state, kept_size = two_updates(model_path)
    assert {t.dtype for k, t in kept_state.items() if not k.startswith("model.layers.1.")
            and k != "model.norm.weight"} == {torch.bfloat16}  # fmt: skip
    monkeypatch.setattr(sharded_model, "store_frozen_in", lambda model, dtype: None)
    fp32, fp32_state, fp32_size = two_updates(model_path)
    assert kept == fp32  # loss, grad norm, KL, entropy, ...: to the bit
    trained = [k for k in kept_state if k.startswith("model.layers.1.") or k == "model.norm.weight"]
    assert trained and all(torch.equal(kept_state[k], fp32_state[k]) for k in trained)
    assert all(kept_state[k].dtype == torch.float32 for k in trained)
    frozen = [k for k in kept_state if k not in trained]
    assert all(torch.equal(kept_state[k], fp32_state[k].to(torch.bfloat16)) for k in frozen)
    assert kept_size < 0.7 * fp32_size
