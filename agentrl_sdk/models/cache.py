"""`cached_build`: build a local model folder once per recipe and reuse it on later runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """Where built models live: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl_sdk``."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl_sdk"))


def cached_build(name: str, recipe: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
    """The folder ``<cache>/<name>-<hash(recipe)>``, calling ``build(folder)`` if it is missing.

    ``recipe`` must hold everything that decides the weights, so a changed recipe builds anew.
    The build writes into a temporary folder that is renamed at the end: an interrupted build
    never leaves a half-written model behind.
    """
    key = hashlib.sha1(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:10]
    folder = cache_root() / f"{name}-{key}"
    if (folder / "config.json").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build(partial)
    partial.rename(folder)
    return folder
