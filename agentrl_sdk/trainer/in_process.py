"""`InProcessRank`: a trainer of one rank in the driver's own process, without Ray.

For a job on one machine with ``world_size`` 1 (a laptop), a Ray actor costs a process of its
own: its runtime (torch, transformers: ~0.3 GB), Ray's own processes (~0.5 GB), and a copy of
every batch and pushed tensor that crosses to it. Here the rank is an ordinary object whose
calls run one at a time, each on a thread of its own, so each call can still be timed out, and a
failure is raised with the rank and call named, as from an actor. What it gives up: a crash
of the trainer is the job's (no rebuild, ``max_restarts`` does not apply), and one process
can host one such rank (it holds the process's torch.distributed group).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_sdk.allocator import return_free_memory
from agentrl_sdk.threads import UserCodeExecutor
from agentrl_sdk.trainer.errors import TrainerError

__all__ = ["InProcessRank"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 30.0
"""Longest wait for the rank's ``close`` when the group shuts down."""


class InProcessRank:
    """Rank 0 of a world of one, ``worker_cls(0, 1, *args)`` built in this process; the same
    calls as `RayRanks`.

    Raises:
        TrainerError: This process already holds a torch.distributed group (another
            in-process trainer, or the caller's own).
    """

    def __init__(self, worker_cls: type, args: Sequence[Any]) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            raise TrainerError(
                "trainer.placement 'in_process': this process already holds a torch.distributed "
                "group (another in-process trainer, e.g. a critic, or your own); give the other "
                "trainers placement: ray"
            )
        # One dispatcher thread: the rank's calls run in order, as an actor's do, each on a
        # thread of its own (`_on_fresh_thread`). Daemons, which exit never waits for: a call
        # stuck past its timeout must not hold the job's process open.
        self._pool = UserCodeExecutor(1, thread_name_prefix="agentrl-trainer")
        self._worker = worker_cls(0, 1, *args)
        self._threads = 0  # torch threads the last call left set (0: not yet set)

    def submit(
        self, fn: Callable[..., Any], *args: Any, first_only: bool = False
    ) -> list[concurrent.futures.Future[Any]]:
        """Starts ``fn(rank, *args)`` after the rank's earlier calls; one handle, for `wait`."""
        del first_only  # rank 0 is every rank
        return [self._pool.submit(self._on_fresh_thread, fn, (self._worker, *args))]

    def _on_fresh_thread(self, call: Any, args: tuple[Any, ...]) -> Any:
        """``call(*args)`` on a thread that ends with it, so its OpenMP team ends too.

        GNU OpenMP keeps a thread's team for the thread's life, and once the teams' threads
        outnumber the cores it stops spin-waiting in every team: an idle trainer team beside
        the engine's cut the engine's decode from 52 to 43 tok/s (two cores). The torch
        thread count a call sets (``setup``) carries over to the next call's thread.
        """
        import torch

        outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if self._threads:
                torch.set_num_threads(self._threads)
            return_free_memory()  # what the rollouts freed, before an update allocates
            try:
                outcome.set_result(call(*args))
            except BaseException as exc:  # noqa: BLE001 - raised again in the pool's thread
                outcome.set_exception(exc)
            self._threads = torch.get_num_threads()
            return_free_memory()  # the next call's thread may be given another malloc arena

        thread = threading.Thread(target=run, name="agentrl-trainer-call", daemon=True)
        thread.start()
        thread.join()
        return outcome.result()

    @staticmethod
    def wait(
        handles: list[concurrent.futures.Future[Any]], method: str, timeout: float
    ) -> list[Any]:
        """The result of the one handle within ``timeout`` seconds.

        Raises:
            TrainerError: The call raised (with its error as the cause), or did not finish in
                time (it runs on; the group's next calls queue behind it).
        """
        (handle,) = handles
        try:
            return [handle.result(timeout=timeout)]
        except concurrent.futures.TimeoutError:
            raise TrainerError.timed_out(method, timeout, [0]) from None
        except Exception as exc:
            raise TrainerError.rank_failed(0, method, exc) from exc

    def stop(self, graceful: bool = True) -> None:
        """Runs the rank's ``close`` (leaves the process group, deletes staged files) and ends
        its thread."""
        if graceful:
            try:
                self._pool.submit(self._worker.close).result(timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - shutting down: report, go on
                logger.warning("closing the in-process trainer rank failed: %r", exc)
        self._pool.shutdown(wait=False, cancel_futures=True)
