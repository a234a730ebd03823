"""Thread settings vLLM-CPU needs to use the machine: one rule, shared by both vLLM engines.

With its defaults vLLM-CPU reserves one CPU for its front end and binds torch to the rest: on a
2-core machine that is one thread, and SmolLM2-135M decoded 15.5 tok/s. Letting torch use every
CPU this process may run on (``OMP_NUM_THREADS``, ``VLLM_CPU_OMP_THREADS_BIND``, no reserved CPU)
made 140-200 tok/s there. vLLM-CPU also sizes its KV cache from a fraction of all RAM by default
and refuses to start when that much is not free; a fixed ``VLLM_CPU_KVCACHE_SPACE`` starts on a
shared machine. Variables the user set are kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DEFAULT_KV_CACHE_GIB", "vllm_cpu_env"]

DEFAULT_KV_CACHE_GIB = 4
"""KV cache of a vLLM-CPU engine unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise."""


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def vllm_cpu_env(threads: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to ``base`` (default ``os.environ``) before vLLM-CPU starts.

    Args:
        threads: Torch threads of the vLLM worker; ``None`` uses every CPU this process may
            run on. Ignored (``{}`` returned) when CUDA is available: GPU vLLM needs none.
        base: The environment the engine will inherit; names already set there are left alone.

    Returns:
        ``OMP_NUM_THREADS``, ``VLLM_CPU_OMP_THREADS_BIND`` (the first ``threads`` usable CPUs)
        ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB,
        `DEFAULT_KV_CACHE_GIB`), minus those ``base`` already sets.
    """
    import torch

    if torch.cuda.is_available():
        return {}
    base = os.environ if base is None else base
    cpus = _usable_cpus()
    count = len(cpus) if threads is None else max(1, min(threads, len(cpus)))
    wanted = {
        "OMP_NUM_THREADS": str(count),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus[:count]),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(DEFAULT_KV_CACHE_GIB),
    }
    return {k: v for k, v in wanted.items() if k not in base}
