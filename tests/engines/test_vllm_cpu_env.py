"""The thread and KV-cache settings vLLM-CPU engines start with."""

from __future__ import annotations

import os

import pytest

from agentrl_sdk.engines._vllm_cpu_env import DEFAULT_KV_CACHE_GIB, vllm_cpu_env


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


def test_every_usable_cpu_and_none_reserved(two_cpus):
    assert vllm_cpu_env(base={}) == {
        "OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": str(DEFAULT_KV_CACHE_GIB),
    }  # fmt: skip


def test_cpu_threads_caps_the_binding_and_user_settings_win(two_cpus):
    env = vllm_cpu_env(1, base={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "7"})
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
