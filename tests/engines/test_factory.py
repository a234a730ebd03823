"""create_engine and the engine config: backends by name, pools of replicas, config checks."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.engines import EnginePool, TorchEngine, create_engine
from agentrl_sdk.engines._vllm_weights import write_buckets
from agentrl_sdk.pipeline.config import EngineConfig, TrainConfig
from agentrl_sdk.types import GenerateResult
from tests.engines._tiny import tiny_model_dir


def test_unknown_backend_names_the_available_ones() -> None:
    with pytest.raises(ValueError, match="'torch', 'vllm', 'vllm-server'"):
        create_engine("tgi", "/nowhere")


def test_replicas_build_a_pool_of_engines() -> None:
    pool = create_engine("torch", str(tiny_model_dir(0)), replicas=2, max_batch_size=4)
    try:
        assert isinstance(pool, EnginePool)
        assert [type(r) for r in pool.replicas] == [TorchEngine, TorchEngine]
    finally:
        pool.close()


def test_engine_config_defaults_to_one_torch_engine() -> None:
    config = TrainConfig().engine
    assert (config.backend, config.replicas) == ("torch", 1)
    assert config.create_kwargs() == {"replicas": 1, "ray_actors": False, "max_batch_size": 64}
    server = EngineConfig(backend="vllm-server", url="http://127.0.0.1:8000",
                          options={"start_timeout_s": 60})  # fmt: skip
    assert server.create_kwargs()["url"] == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="engine.url is for backend 'vllm-server'"):
        EngineConfig(backend="vllm", url="http://127.0.0.1:8000")


def test_generate_result_versions_default_to_the_policy_version() -> None:
    plain = GenerateResult(token_ids=[1, 2], logprobs=[-1.0, -2.0], finish_reason="stop",
                           policy_version=3)  # fmt: skip
    assert plain.versions == [3, 3]
    mixed = plain.model_copy(update={"token_versions": [2, 3]})
    assert mixed.versions == [2, 3]
    with pytest.raises(ValueError, match="token_versions"):
        GenerateResult(token_ids=[1], logprobs=[0.0], finish_reason="stop", policy_version=0,
                       token_versions=[0, 1])  # fmt: skip


def test_weight_buckets_split_by_size_and_keep_tied_tensors(tmp_path) -> None:
    from safetensors.torch import load_file

    shared = torch.randn(8, 4)
    state = {"embed.weight": shared, "head.weight": shared, "b": torch.ones(100)}
    paths = write_buckets(state, tmp_path, bucket_bytes=200)
    assert len(paths) == 3  # 128 + 128 bytes overflow a 200-byte bucket; b (400) goes alone
    loaded = {k: v for p in paths for k, v in load_file(p).items()}
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
