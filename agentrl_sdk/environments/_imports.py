"""Importing an environment library without it changing the process for what runs later."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def import_environment_library(module: str, missing: str) -> ModuleType:
    """``import module``, with ``os.environ`` as it was before: some of these libraries'
    dependencies set process-wide OpenMP variables (``KMP_*``) on import, which engines
    spawned later would inherit.

    Raises:
        ImportError: ``missing`` (what to install), when the library is not installed.
    """
    environ = dict(os.environ)
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # the optional extra
        raise ImportError(missing) from exc
    finally:
        os.environ.clear()
        os.environ.update(environ)
