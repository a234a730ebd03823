"""`SharedWeights`: one full set of weights staged as safetensors files in a host's shared memory.

The trainer's rank 0 writes them bucket by bucket while it gathers: safetensors files
written once, then overwritten in place (`StagedFile`), in two sets that pushes alternate
between. Every engine on the same host maps the files and keeps the mappings. A push's files
are rewritten two pushes later, when every engine has moved to the next push's (the version
barrier), so an engine may serve the mapped tensors themselves, without a copy (`TorchEngine`
does when dtypes match; vLLM copies them into its own layout). Only this small description
crosses the driver, never a tensor, so the driver's memory does not grow with the model, and
N engines read one copy. The price: two copies of the weights in /dev/shm per trained policy
for the trainer's life.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch

__all__ = [
    "SharedWeights",
    "StagedFile",
    "StagedFileSet",
    "host_id",
    "make_stage_folder",
    "read_bucket_file",
    "remove_stage_folder",
    "shm_root",
    "write_bucket_file",
]

_STAGE_PREFIX = "agentrl-weights-"
_ALIASES = "agentrl_aliases"  # metadata key: tied names -> the name their tensor is stored under


@functools.cache
def host_id() -> str:
    """This machine: its host name and boot id (two Ray nodes on one machine share it, as
    they share its /dev/shm)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_root() -> str | None:
    """Where weight files go: /dev/shm (memory) when writable, else None (the temp folder)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def make_stage_folder() -> str:
    """A fresh folder for staged weights (in /dev/shm when it exists), named after this
    process; the folders of processes that died without deleting theirs are removed."""
    root = Path(shm_root() or tempfile.gettempdir())
    for stale in root.glob(f"{_STAGE_PREFIX}*-*"):
        pid = stale.name.removeprefix(_STAGE_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-", dir=root)


def remove_stage_folder(folder: str | os.PathLike[str]) -> None:
    """Delete staged files (only folders `make_stage_folder` made)."""
    path = Path(folder)
    if not path.name.startswith(_STAGE_PREFIX):
        raise ValueError(f"{path} is not a weight staging folder")
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mapped_views(path: str, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Views of a safetensors file's tensors on one shared mapping of it (dtypes and shapes of
    ``like``; offsets from the file's header: 8-byte length, then JSON; a tied name views its
    stored twin). Writes through the views change the file; reads see whoever overwrote it.
    None when a tensor is not aligned to its element size (a view cannot start there)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    aliases = _aliases(header.get("__metadata__"))
    mapped = torch.from_file(path, shared=True, size=os.path.getsize(path), dtype=torch.uint8)
    start = 8 + length
    views = {}
    try:
        for key, tensor in like.items():
            begin, end = header[aliases.get(key, key)]["data_offsets"]
            views[key] = mapped[start + begin : start + end].view(tensor.dtype).view(tensor.shape)
    except RuntimeError:
        return None
    return views


class StagedFile:
    """A bucket file kept mapped by its writer, so later pushes overwrite its tensors in
    place: one memory copy at memory speed, where writing a new file first faults in every
    page of shared memory (measured here: ~14 GB/s in place vs ~1-2 GB/s for a new file).
    The file is written the first time by safetensors; a tied tensor is stored, and copied,
    once.
    """

    def __init__(self, path: str, tensors: Mapping[str, torch.Tensor]) -> None:
        self.path = path
        self.nbytes = write_bucket_file(tensors, path)
        self._aliases = _tied_names(tensors)
        self._views = _mapped_views(path, tensors)  # None: rewrite the file every time

    def overwrite(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Write new values of the same tensors in place; returns their distinct bytes."""
        if self._views is None:
            return write_bucket_file(tensors, self.path)
        views = self._views
        if (
            tensors.keys() != views.keys()
            or _tied_names(tensors) != self._aliases
            or any((t.dtype, t.shape) != (views[k].dtype, views[k].shape) for k, t in tensors.items())
        ):
            raise ValueError(f"{self.path} holds other tensors than this bucket")
        for key, tensor in tensors.items():
            if key not in self._aliases:
                self._views[key].copy_(tensor)
        return self.nbytes


class StagedFileSet:
    """A writer's staged bucket files (trainer rank 0's), kept for its process's life: the
    first push to a name writes the file, later pushes overwrite its tensors in place
    (`StagedFile`). The folder is made on the first write and deleted by `release`."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.files: dict[str, StagedFile] = {}

    def write(self, bucket: Mapping[str, torch.Tensor], name: str) -> tuple[str, int, int]:
        """Write ``bucket`` as file ``name``; returns its path, tensor count and bytes."""
        if self.folder is None:
            self.folder = make_stage_folder()
        path = f"{self.folder}/{name}"
        staged = self.files.get(path)
        if staged is None:
            staged = self.files[path] = StagedFile(path, bucket)
            return path, len(bucket), staged.nbytes
        return path, len(bucket), staged.overwrite(bucket)

    def release(self) -> None:
        """Delete the files and their folder."""
        if self.folder is not None:
            self.files.clear()
            remove_stage_folder(self.folder)
            self.folder = None


class _ReadMappings:
    """A reader's mappings of the staged files it last loaded, kept between pushes: the
    writer overwrites the same files in place, so a kept mapping reads the new weights
    without faulting its pages in again. Files of another folder replace them (a folder's
    files are only ever rewritten in place, never resized)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folder: str | None = None
        self._views: dict[str, dict[str, torch.Tensor] | None] = {}

    def state_dict(self, weights: SharedWeights) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        with self._lock:
            if weights.folder != self._folder:  # let go of the previous folder's mappings
                self._folder, self._views = weights.folder, {}
            for path in weights.paths:
                if path not in self._views:
                    self._views[path] = _mapped_views(path, read_bucket_file(path))
                views = self._views[path]
                state.update(views if views is not None else read_bucket_file(path))
        return state


def read_bucket_file(path: str) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors through safetensors (memory-mapped, copy on write), tied
    names included."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        state = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - not a Mapping
        aliases = _aliases(f.metadata())
    return state | {alias: state[name] for alias, name in aliases.items()}


def _aliases(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The tied names a file's metadata records (`write_bucket_file`)."""
    return json.loads((metadata or {}).get(_ALIASES, "{}"))


def _tied_names(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each name whose tensor is an earlier name's (same memory, shape, strides, dtype) ->
    that name. Different views of one storage (e.g. slices of a fused weight) are not tied."""
    first: dict[tuple, str] = {}
    tied = {}
    for name, tensor in tensors.items():
        same = (tensor.device, tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)
        if same in first:
            tied[name] = first[same]
        else:
            first[same] = name
    return tied


_READER = _ReadMappings()


def write_bucket_file(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str]
) -> int:
    """Write ``tensors`` as one safetensors file; returns the bytes of the distinct tensors.

    A tied tensor (one storage under several names) is stored once, under its first name
    (safetensors refuses shared storage); the file's metadata names the others, which this
    module's readers restore. Other readers (vLLM's loader) see the first name only, as a
    model with tied weights expects.
    """
    from safetensors.torch import save_file

    tied = _tied_names(tensors)
    out = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items() if k not in tied}
    save_file(out, str(path), metadata={_ALIASES: json.dumps(tied)} if tied else None)
    return sum(tensor.numel() * tensor.element_size() for tensor in out.values())


@dataclass(frozen=True)
class SharedWeights:
    """A push's weights as files on ``host`` (a `WeightPush` of kind ``shared_files``; see the
    module docstring). An engine may serve the mapped tensors without a copy
    (``serves_in_place``): the trainer rewrites them only two pushes later."""

    kind: ClassVar[Literal["shared_files"]] = "shared_files"
    serves_in_place: ClassVar[bool] = True
    host: str  # `host_id` of the machine whose shared memory holds the files
    folder: str
    paths: tuple[str, ...]  # the bucket files, in order
    tensors: int
    nbytes: int
    partial: bool = False  # only the tensors that may differ from the engines' model folder

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors by key, memory-mapped from the files (read where ``host`` is this one)."""
        if self.host != host_id():
            raise RuntimeError(f"weights staged on {self.host!r} cannot be mapped on {host_id()!r}")
        return _READER.state_dict(self)
