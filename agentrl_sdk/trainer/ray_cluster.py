"""Ray for the trainer: starting it, checking the cluster can host the ranks, the ranks as Ray
actors (`RayRanks`), where a rank runs, and waiting on the ranks' results."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from agentrl_sdk.ports import free_port
from agentrl_sdk.threads import RAY_SUBMIT_LOCK
from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.errors import RankDiedError, TrainerError

__all__ = [
    "RayRanks", "check_resources", "init_ray", "ray_if_started", "rendezvous_address",
    "wait_ranks",
]

logger = logging.getLogger(__name__)


def check_resources(config: TrainerConfig) -> None:
    """Fails fast when the cluster can never host the workers; warns when it is busy now."""
    import ray

    need = {
        "CPU": config.world_size * config.num_cpus_per_worker,
        "GPU": config.world_size * config.num_gpus_per_worker,
        **{name: config.world_size * amount for name, amount in config.resources.items()},
    }
    total, free = ray.cluster_resources(), ray.available_resources()
    for name, amount in need.items():
        if amount and total.get(name, 0.0) < amount:
            raise TrainerError(
                f"{config.world_size} workers need {amount:g} {name} but the Ray cluster has "
                f"{total.get(name, 0.0):g}; lower world_size or "
                + (f"num_{name.lower()}s_per_worker" if name in ("CPU", "GPU") else
                   f"trainer.resources[{name!r}], or start nodes that offer it")
            )
        if amount and free.get(name, 0.0) < amount:
            logger.warning(
                "%d workers need %g %s but only %g are free now; they start when other actors "
                "release theirs (or fail after init_timeout_s)",
                config.world_size, amount, name, free.get(name, 0.0),
            )  # fmt: skip


def init_ray(config: TrainerConfig) -> bool:
    """Initialises Ray (``config.ray_address``, or a private local cluster) unless it already
    is; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if config.ray_address:
        _wait_reachable(config.ray_address, config.init_timeout_s)
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
        return True
    # Ray >= 2.60 turns token authentication on by default; a private local cluster needs none.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts worker processes at nice 15. Our actors (trainer ranks, engines) are the job's
    # main work: niced, an update got ~20% of a core while the driver sampled the next batch.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # No idle worker started ahead of need: ~0.3 GB of RSS for a process no actor may use.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    ray.init(
        # "local": a private cluster even when another one runs on this machine (ray.init()
        # would join the newest `ray start` cluster it finds, and refuse num_cpus there).
        address="local",
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    return True


def _wait_reachable(address: str, timeout_s: float) -> None:
    """Waits until something listens at a ``host:port`` Ray address. ``ray.init`` itself retries
    a cluster that is not there forever (one warning every 30 s), so a head that never came up
    would hang the job instead of failing it. Other forms ("auto", "ray://...") go to Ray."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5.0).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise TrainerError(
                    f"no Ray cluster answers at trainer.ray_address={address!r} after "
                    f"{timeout_s:g} s ({error}); start it with `ray start --head --port={port}` "
                    "or leave ray_address unset for a local cluster"
                ) from None
            time.sleep(1.0)


def ray_if_started() -> ModuleType | None:
    """Ray, when this process has started (or joined) it; None otherwise. A process that never
    imported Ray (an in-process trainer's) does not import it here."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def rendezvous_address() -> tuple[str, int]:
    """This node's IP and a free TCP port on it, for rank 0 to host the rendezvous."""
    # Outside Ray (a rank built by hand) the ranks share this machine; inside, every rank
    # must reach this node's address: no fallback that would hang a 2-node rendezvous.
    ray = ray_if_started()
    ip = ray.util.get_node_ip_address() if ray else "127.0.0.1"
    return ip, free_port("")


def wait_ranks(refs: list[Any], method: str, timeout: float) -> list[Any]:
    """Results of ``refs`` (one per rank, in rank order); the first failure is raised with its
    rank (`TrainerError`, or `RankDiedError` when its process died)."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    deadline = time.monotonic() + timeout
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        left = max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            ranks = sorted(rank_of[r] for r in pending)
            raise TrainerError.timed_out(method, timeout, ranks)
        rank = rank_of[ready[0]]
        try:
            results[rank] = ray.get(ready[0], timeout=max(1.0, deadline - time.monotonic()))
        except RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            failed, died = _failed_ranks(pending, rank_of)
            if died:
                # A peer's death reaches the living ranks' collectives (gloo: "connection reset
                # by peer") before Ray reports the dead actor: the group must be rebuilt.
                raise RankDiedError.during(died[0], method, cause, failed_rank=rank) from cause
            raise TrainerError.rank_failed(rank, method, cause, failed) from cause
        except RayActorError as exc:
            raise RankDiedError.during(rank, method, exc) from exc
    return results


def _failed_ranks(
    refs: list[Any], rank_of: dict[Any, int], wait_s: float = 5.0
) -> tuple[list[int], list[int]]:
    """Ranks among ``refs`` that fail within ``wait_s``, and those of them whose process died.
    Reading their errors keeps Ray from reporting them again as unhandled. The wait ends as
    soon as every rank has answered; ranks still blocked in a collective cost the full wait."""
    import ray
    from ray.exceptions import RayActorError

    if not refs:
        return [], []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    failed, died = [], []
    for ref in ready:
        try:
            ray.get(ref, timeout=wait_s)
        except RayActorError:
            failed.append(rank_of[ref])
            died.append(rank_of[ref])
        except Exception:  # noqa: BLE001 - only which ranks failed matters here
            failed.append(rank_of[ref])
    return sorted(failed), sorted(died)


class RayRanks:
    """``config.world_size`` ranks ``worker_cls(rank, world_size, *args)``, one Ray actor (a
    process) each, with the CPUs, GPUs and custom resources of ``config``."""

    def __init__(self, worker_cls: type, config: TrainerConfig, args: Sequence[Any]) -> None:
        import ray

        actor_cls = ray.remote(worker_cls)
        self._actors = [
            actor_cls.options(
                num_cpus=config.num_cpus_per_worker, num_gpus=config.num_gpus_per_worker,
                resources=dict(config.resources) or None,
            ).remote(rank, config.world_size, *args)
            for rank in range(config.world_size)
        ]

    def submit(self, fn: Callable[..., Any], *args: Any, first_only: bool = False) -> list[Any]:
        """Starts ``fn(rank, *args)`` (through the rank's ``run``) on every rank (rank 0 alone
        with ``first_only``); returns one handle per rank, for `wait`."""
        actors = self._actors[:1] if first_only else self._actors
        with RAY_SUBMIT_LOCK:
            return [actor.run.remote(fn, *args) for actor in actors]

    wait = staticmethod(wait_ranks)

    def stop(self, graceful: bool = True) -> None:
        """Closes the ranks (``graceful``: their ``close`` first, at most 30 s) and kills them."""
        import ray

        actors, self._actors = self._actors, []
        if actors and graceful:
            refs = [a.close.remote() for a in actors]
            ray.wait(refs, num_returns=len(refs), timeout=30)
        for actor in actors:
            ray.kill(actor)
