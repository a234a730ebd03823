"""Starting Ray for the trainer, checking the cluster can host its workers, and where a rank
runs in it."""

from __future__ import annotations

import logging
import os
import socket

from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.errors import TrainerError

__all__ = ["check_resources", "init_ray", "ray_node_id", "rendezvous_address"]

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
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
        return True
    # Ray >= 2.60 turns token authentication on by default; a private local cluster needs none.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts worker processes at nice 15. Our actors (trainer ranks, engines) are the job's
    # main work: niced, an update got ~20% of a core while the driver sampled the next batch.
    os.environ.setdefault("RAY_worker_niceness", "0")
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


def rendezvous_address() -> tuple[str, int]:
    """This node's IP and a free TCP port on it, for rank 0 to host the rendezvous."""
    import ray

    # Outside Ray (a rank built by hand) the ranks share this machine; inside, every rank
    # must reach this node's address: no fallback that would hang a 2-node rendezvous.
    ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return ip, s.getsockname()[1]


def ray_node_id() -> str | None:
    """The Ray node this worker runs on (None outside Ray): where a multi-node job placed it."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
