"""Modules that moved, importable under their former names with a `DeprecationWarning`.

User code written against a former path (an engine importing ``agentrl_sdk.engines.weights``)
keeps working: the former name is the same module object as the new one. One entry per move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "agentrl_sdk.engines.weights": "agentrl_sdk.weights.push",
    "agentrl_sdk.engines.shared_weights": "agentrl_sdk.weights.shared_files",
    "agentrl_sdk.engines.collective_weights": "agentrl_sdk.weights.collective",
    "agentrl_sdk.engines.ray_weights": "agentrl_sdk.weights.object_refs",
    "agentrl_sdk.engines.lora_weights": "agentrl_sdk.weights.adapters",
    "agentrl_sdk.engines.tensor_transport": "agentrl_sdk.weights.tensor_transport",
    "agentrl_sdk.trainer.weight_export": "agentrl_sdk.trainer.exports",
    "agentrl_sdk.engines.torch_engine": "agentrl_sdk.engines.torch.engine",
    "agentrl_sdk.engines.vllm_engine": "agentrl_sdk.engines.vllm.engine",
    "agentrl_sdk.engines.vllm_server": "agentrl_sdk.engines.vllm.server",
    "agentrl_sdk.engines.ray_engine": "agentrl_sdk.engines.ray",
    # named in `vllm serve --worker-extension-cls` commands users wrote
    "agentrl_sdk.engines._vllm_weights": "agentrl_sdk.engines.vllm.weights",
    "agentrl_sdk.pipeline.gate": "agentrl_sdk.engines.gate",
    "agentrl_sdk.chat.user_engines": "agentrl_sdk.engines.user_engines",
    "agentrl_sdk.tools.session": "agentrl_sdk.tools.lifecycle",
}
"""Former module name -> where it lives now."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the former names of `MOVED` and loads them as the modules they became."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname: str, path: object, target: object = None):  # noqa: ANN201
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        module = importlib.import_module(new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing runs (the module is the new one, already run); the import machinery stamped
        the former name's spec on it, and the module's own comes back."""
        module.__spec__ = self._own_specs.pop(module.__spec__.name)


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
