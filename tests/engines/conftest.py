"""vLLM settings for engine tests on a small CPU machine (set before vllm is imported)."""

from __future__ import annotations

import os
import tempfile

# A 1 GiB KV cache is plenty for the tiny model; usage stats would try the network.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(tempfile.gettempdir(), "agentrl-vllm-cache"))
