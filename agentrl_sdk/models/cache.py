"""`cached_build`: build a local model folder once per recipe and reuse it on later runs."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
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
) -> Path:
    """The folder ``<cache>/<name>-<hash(recipe)>``, calling ``build(folder)`` if it is missing.

    ``recipe`` must hold everything that decides the weights, so a changed recipe builds anew.
    The build writes into a temporary folder that is renamed at the end: an interrupted build
    never leaves a half-written model behind.

    With ``isolated``, the build runs in a fresh (spawned) process: a warm start's optimizer,
    activations and float32 copies go back to the OS when it ends, instead of staying in the
    caller's heap for the training that follows (allocators rarely return freed memory).
    ``build`` must then be picklable (a module-level function or a ``functools.partial`` of
    one); its exceptions are raised here.
    """
    key = hashlib.sha1(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:10]
    folder = cache_root() / f"{name}-{key}"
    if (folder / "config.json").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if isolated:
        _build_in_child(build, partial)
    else:
        build(partial)
    partial.rename(folder)
    return folder


def _build_in_child(build: Callable[[Path], None], folder: Path) -> None:
    try:
        pickle.dumps(build)
    except Exception as exc:  # lambdas, closures, bound methods of unpicklable objects
        raise TypeError(
            f"cached_build(isolated=True) needs a picklable build (a module-level function or "
            f"a functools.partial of one), got {build!r}: {exc}"
        ) from exc
    spawn = multiprocessing.get_context("spawn")  # never fork a process holding torch threads
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
        child.submit(build, folder).result()
