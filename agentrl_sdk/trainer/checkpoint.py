"""Trainer checkpoints: sharded model and optimizer (torch.distributed.checkpoint), schedule,
counters, per-rank RNG states and the caller's ``extra`` dict.

Layout of a checkpoint folder::

    dcp/                  model + optimizer, one file per rank plus .metadata (DCP)
    rng/rank_{r}.pt       torch (CPU, CUDA), python and numpy RNG states of rank r
    trainer_state.json    step, updates, world_size, scheduler state, extra

DCP is used rather than full state dicts so that no rank ever holds the whole model and
optimizer (a full AdamW state is three model copies), every rank writes its shard in
parallel, and a checkpoint loads into another world size (DCP reshards on load). With
``trained_only`` (LoRA) frozen parameters are left out: the base comes from the model folder,
so a checkpoint holds the adapters and their optimizer state only.
Every function here is a collective: all ranks call it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch import nn

__all__ = ["load_checkpoint", "save_checkpoint"]

logger = logging.getLogger(__name__)

_STATE_FILE = "trainer_state.json"


def save_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    trainer_state: dict[str, Any],
    trained_only: bool = False,
) -> None:
    """Writes a checkpoint into ``path.partial`` (a folder every rank sees), then renames it to
    ``path`` (replacing it). ``trainer_state`` (counters and the caller's ``extra``) and the
    scheduler's state must be JSON-serialisable; rank 0's is kept. ``trained_only``: see the
    module docstring."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    final = Path(path)
    staging = final.with_name(final.name + ".partial")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "rng").mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = _state_dicts(model, optimizer, trained_only)
    with _alone() as alone:
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=staging / "dcp",
                 no_dist=alone)
    torch.save(_rng_state(), staging / "rng" / f"rank_{rank}.pt")
    if rank == 0:
        state = trainer_state | {"scheduler": scheduler.state_dict()}
        (staging / _STATE_FILE).write_text(json.dumps(state, indent=1))
    dist.barrier()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    dist.barrier()


def load_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    trained_only: bool = False,
) -> dict[str, Any]:
    """Restores model, optimizer, scheduler and this rank's RNG states from ``path``
    (``trained_only`` as it was saved: frozen parameters keep their current values); returns
    the ``trainer_state`` given to `save_checkpoint`.

    Raises:
        FileNotFoundError: ``path`` holds no checkpoint.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    folder = Path(path)
    state_file = folder / _STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"no trainer checkpoint at {folder} (missing {_STATE_FILE})")
    trainer_state = json.loads(state_file.read_text())
    model_sd, optim_sd = _state_dicts(model, optimizer, trained_only)
    state = {"model": model_sd, "optimizer": optim_sd}
    with _alone() as alone:
        dcp.load(state, checkpoint_id=folder / "dcp", no_dist=alone)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=not trained_only),
    )  # fmt: skip
    scheduler.load_state_dict(trainer_state.pop("scheduler"))
    rank = dist.get_rank()
    rng_file = folder / "rng" / f"rank_{rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    else:
        logger.warning(
            "checkpoint %s has no RNG state for rank %d (saved by %s ranks); this rank's RNGs "
            "keep their current state", folder, rank, trainer_state.get("world_size", "?"),
        )  # fmt: skip
    dist.barrier()
    return trainer_state


def _state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer, trained_only: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state dicts; with ``trained_only``, the keys the optimizer trains only.

    Filtered here rather than with ``StateDictOptions(ignore_frozen_params=True)``, which keeps
    a tied frozen weight's second name (``lm_head.weight``: the whole embedding again).
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    if trained_only:
        # The optimizer's parameters: with several LoRA adapters, one adapter's (each has its
        # own optimizer and checkpoint).
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        trained = {name for name, p in model.named_parameters() if id(p) in mine}
        model_sd = {k: v for k, v in model_sd.items() if k in trained}
    return model_sd, optim_sd


def _rng_state() -> dict[str, Any]:
    """Torch (CPU and CUDA), Python and numpy RNG states, in types ``weights_only`` loads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _alone() -> Iterator[bool]:
    """True for a single rank, which saves and loads without collectives (DCP's warning that
    it does so is silenced). DCP's collectives run a parallel copy on a gloo thread, whose
    OpenMP team then outlives the job (torch's DTensor caches keep the process group): the idle
    team slowed the next job's rollouts in the same process 1.25-1.46x (the in-process trainer is
    such a rank)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield dist.get_world_size() == 1
