"""`cached_build`: build a local model folder once per recipe and reuse it on later runs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import pickle
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """Where built models live: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl_sdk``."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl_sdk"))


def cached_build(
    name: str,
    recipe: Mapping[str, Any],
    build: Callable[[Path], None],
    *,
    isolated: bool = False,
    timeout_s: float = 3 * 3600.0,
) -> Path:
    """The folder ``<cache>/<name>-<hash(recipe)>``, calling ``build(folder)`` if it is missing.

    ``recipe`` must hold everything that decides the weights, so a changed recipe builds anew.
    The build writes into a temporary folder that is renamed at the end: an interrupted build
    never leaves a half-written model behind.

    With ``isolated``, the build runs in a fresh (spawned) process: a warm start's optimizer,
    activations and float32 copies go back to the OS when it ends, instead of staying in the
    caller's heap for the training that follows (allocators rarely return freed memory).
    ``build`` must then be picklable (a module-level function or a ``functools.partial`` of
    one); its exceptions are raised here, and a child that runs past ``timeout_s`` or dies
    is killed or reported with a `RuntimeError`, never waited on forever.
    """
    key = hashlib.sha1(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:10]
    folder = cache_root() / f"{name}-{key}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _only_builder(folder, timeout_s):
        if (folder / "config.json").exists():  # built by the process we waited for
            return folder
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        if isolated:
            _build_in_child(build, partial, timeout_s)
        else:
            build(partial)
        partial.rename(folder)
    return folder


@contextlib.contextmanager
def _only_builder(folder: Path, timeout_s: float) -> Iterator[None]:
    """Hold ``<cache>/.locks/<folder>.lock`` while building: two jobs started at once on one
    machine build a recipe once, the second waiting for the first. The OS drops the lock of a
    process that dies, so a crashed build never blocks the next one. The locks live apart so
    the cache itself lists only models."""
    locks = folder.parent / ".locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{folder.name}.lock", "w") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another process has been building {folder.name} for "
                                       f"over {timeout_s:.0f} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_in_child(build: Callable[[Path], None], folder: Path, timeout_s: float) -> None:
    try:
        pickle.dumps(build)
    except Exception as exc:  # lambdas, closures, bound methods of unpicklable objects
        raise TypeError(
            f"cached_build(isolated=True) needs a picklable build (a module-level function or "
            f"a functools.partial of one), got {build!r}: {exc}"
        ) from exc
    spawn = multiprocessing.get_context("spawn")  # never fork a process holding torch threads
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_run_build, args=(build, folder, send), daemon=True)
    child.start()
    send.close()  # the child holds the only writer: a dead child reads as EOF here
    try:
        if not receive.poll(timeout_s):
            raise RuntimeError(f"the isolated build of {folder.name} ran over {timeout_s:.0f} s")
        error = receive.recv()
    except EOFError:
        child.join(10)
        raise RuntimeError(
            f"the isolated build of {folder.name} died (exit code {child.exitcode})"
        ) from None
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
    if error is not None:
        raise error


def _run_build(build: Callable[[Path], None], folder: Path, done: Any) -> None:
    """In the child: run the build, then send None or the exception it raised."""
    try:
        build(folder)
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        done.send(exc)
    else:
        done.send(None)
