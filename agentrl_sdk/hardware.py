"""Which dtype this hardware computes fast: bfloat16 only where it is native.

CPUs with AVX512-BF16 or AMX (recent Xeons, AMD Zen 4 and later) run bf16 matmuls through
oneDNN, ~2.6x the float32 speed for the demo's decoding. Elsewhere (AVX2-only laptops and
servers) torch falls back to a reference loop: measured here on an AVX2 AMD EPYC, a
(600 x 576) x (576 x 49k) LM-head forward took 2.8 s in bf16 against 0.4 s in float32, its
backward 48 s against 0.9 s, and the demo's 12-step warm start ~80 min instead of ~2. So a
recipe asks for ``prefer-bfloat16``: bfloat16 where native, float32 elsewhere.
"""

from __future__ import annotations

import functools
import logging

__all__ = ["PREFER_BF16", "bf16_is_native", "resolve_dtype"]

logger = logging.getLogger(__name__)

PREFER_BF16 = "prefer-bfloat16"
"""A dtype setting: ``bfloat16`` where the hardware computes it natively, else ``float32``."""


@functools.cache
def bf16_is_native(device: str = "cpu") -> bool:
    """Whether ``device`` ('cpu' or 'cuda') multiplies bf16 matrices natively."""
    import torch

    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())  # fmt: skip


def resolve_dtype(name: str, device: str | None = "cpu") -> str:
    """``name`` as the dtype to use on ``device`` (None: a GPU when this process sees one,
    else the CPU): `PREFER_BF16` resolved, others as given (an explicit 'bfloat16' where it is
    not native is kept, with a warning, once)."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if name == PREFER_BF16:
        return "bfloat16" if bf16_is_native(device) else "float32"
    if name == "bfloat16" and not bf16_is_native(device):
        _warn_emulated(device)
    return name


@functools.cache
def _warn_emulated(device: str) -> None:
    logger.warning(
        "dtype bfloat16 on a %s without native bf16 (no AVX512-BF16/AMX): its matmuls take a "
        "reference path, often 5-50x slower than float32; use dtype %r to get float32 here",
        device, PREFER_BF16,
    )  # fmt: skip
