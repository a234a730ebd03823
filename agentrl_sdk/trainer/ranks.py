"""`RankSet`: a trainer group's ranks (Ray actors, `RayRanks`, or this process, `InProcessRank`),
started, called in lockstep, and rebuilt when one dies."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.trainer.errors import RankDiedError, TrainerError
from agentrl_sdk.trainer.in_process import InProcessRank
from agentrl_sdk.trainer.ray_cluster import RayRanks, ray_if_started
from agentrl_sdk.trainer.replay import ReplayLog
from agentrl_sdk.trainer.sharded_model import ShardedRank
from agentrl_sdk.trainer.worker import on_adapter

__all__ = ["RankSet"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


class RankSet:
    """``config.world_size`` ranks of ``worker_cls`` driven in lockstep: every call is broadcast
    to all of them (their collectives need each other) and waits at most ``call_timeout_s``.

    A call made through `recovering` survives a rank's death: the ranks are rebuilt in the state
    before it (the last checkpoint, then every update since replayed from `replay_log`), at most
    ``max_restarts`` times in all, and the call is made again. Each rank is
    ``worker_cls(rank, world_size, *args)``.
    """

    def __init__(
        self,
        worker_cls: type[ShardedRank],
        config: TrainerConfig,
        args: tuple[Any, ...],
        replay_log: ReplayLog,
    ) -> None:
        self.worker_cls = worker_cls
        self.config = config
        self.args = args
        self.replay_log = replay_log
        self.restarts = 0
        self._ranks: InProcessRank | RayRanks | None = None
        self.info: dict[str, Any] = {}  # rank 0's setup info (device, dtype, host, parameters)
        self.node_ids: list[str | None] = []  # the Ray node of each rank
        self.pids: list[int] = []  # the process of each rank

    def start(self) -> None:
        """Start the ranks, rendezvous, and load the model in each."""
        cfg = self.config
        if cfg.placement == "in_process":
            self._ranks = InProcessRank(self.worker_cls, self.args)
        else:
            self._ranks = RayRanks(self.worker_cls, cfg, self.args)
        try:
            address = self.submit(ShardedRank.rendezvous_address, first_only=True)
            ip, port = self.wait(address, ShardedRank.rendezvous_address, cfg.init_timeout_s)[0]
            ray = ray_if_started()
            if ray and ip == ray.util.get_node_ip_address():
                ip = "127.0.0.1"  # rank 0 shares the driver's node: stay on loopback
            ranks = self.call(ShardedRank.setup, ip, port, timeout=cfg.init_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.info = ranks[0]
        self.node_ids = [r["node_id"] for r in ranks]
        self.pids = [r["pid"] for r in ranks]

    def stop(self, graceful: bool = True) -> None:
        """End the ranks (idempotent)."""
        ranks, self._ranks = self._ranks, None
        if ranks is not None:
            ranks.stop(graceful)

    def submit(self, fn: Callable[..., Any], *args: Any, first_only: bool = False) -> list[Any]:
        """Starts ``fn(rank, *args)`` on every rank (rank 0 alone with ``first_only``): ``fn`` is
        a method of the rank class (``PolicyWorker.update``) or a function of a rank. Returns
        one handle per rank, for `wait`."""
        return self._live(fn).submit(fn, *args, first_only=first_only)

    def wait(
        self, handles: list[Any], fn: Callable[..., _T], timeout: float | None = None
    ) -> list[_T]:
        """The results of `submit`'s ``handles`` of ``fn`` in rank order, within ``timeout``
        (default ``call_timeout_s``); a failure raises `TrainerError` (`RankDiedError` for a
        dead rank)."""
        return self._live(fn).wait(handles, fn.__name__, timeout or self.config.call_timeout_s)

    def _live(self, fn: Callable[..., Any]) -> InProcessRank | RayRanks:
        if self._ranks is None:
            raise TrainerError(f"{fn.__name__}: the trainer group is shut down")
        return self._ranks

    def call(self, fn: Callable[..., _T], *args: Any, timeout: float | None = None) -> list[_T]:
        """Runs ``fn(rank, *args)`` on every rank; returns the results in rank order."""
        return self.wait(self.submit(fn, *args), fn, timeout)

    def recovering(self, call: Callable[[], _T]) -> _T:
        """``call()``; when a rank dies, rebuild the ranks in the state before it (at most
        ``max_restarts`` times in all) and call again."""
        while True:
            try:
                return call()
            except RankDiedError as exc:
                self.replay_log.check(exc)
                if self.restarts >= self.config.max_restarts:
                    raise TrainerError(
                        f"{exc}; the group was already rebuilt {self.restarts} time(s) "
                        f"(trainer.max_restarts): resume from the last checkpoint"
                    ) from exc
                logger.warning("%s: rebuilding the trainer group (restart %d of %d)", exc,
                               self.restarts + 1, self.config.max_restarts)
                self.rebuild()

    def rebuild(self) -> None:
        """New ranks in the state of the old ones: the last checkpoint (or the model), then
        every update made since, replayed on the same batches."""
        self.restarts += 1
        self.stop(graceful=False)  # survivors may be stuck in a collective
        self.start()
        load, update = ShardedRank.load_checkpoint, self.worker_cls.update
        self.replay_log.replay(
            lambda adapter, folder: self.call(*on_adapter(adapter, load, folder)),
            lambda adapter, batch: self.call(*on_adapter(adapter, update, batch)),
        )
