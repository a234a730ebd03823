"""The pipeline's rules, as pure functions of the config and counts: which schedule a job runs,
when rows are admitted and how many at once, the seed of a row, when a group is too stale, how
many groups without signal dynamic sampling may pass over, and the staleness metrics.

Nothing here touches engines, Ray or the event loop: `loop` and `rollouter` apply these rules.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.types import Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.pipeline.config import TrainConfig

__all__ = [
    "Schedule",
    "dynamic_sampling_metrics",
    "rollout_config",
    "rows_to_admit",
    "sampled_steps",
    "seed_step",
    "staleness_metrics",
]


@dataclass(frozen=True)
class Schedule:
    """How rollouts and updates interleave; ``sync`` is the on-policy case of the same loop.

    Attributes:
        batch_size: Groups (rows) an update trains on.
        n: Rollouts per group.
        concurrency: Rollouts at once (``rollout.concurrency``).
        max_staleness: Updates a trained token may lag the trainer (0: on-policy).
        sync_every: Updates between weight pushes.
        retry_stale: A group found too stale is rolled out again (else dropped, counted).
        batched: The rows the bound allows start together as one rollout batch (sync: a step's
            rows reach the engine at once, as one batch) rather than one row at a time.
        prefetch: The next step's rows start while the trainer updates, behind the closed
            weight gate, so their first LLM call waits for the new weights.
        dynamic_sampling: Groups without signal are left out of updates.
        flat_budget: Groups without signal an update may pass over to fill its batch.
        engine_retries: Times a row whose rollouts failed because their engine did
            (``engine_error``) is rolled out again, on the weights pushed after the failure;
            then its group is trained as it is (the failures counted).
    """

    batch_size: int
    n: int
    concurrency: int
    max_staleness: int = 0
    sync_every: int = 1
    retry_stale: bool = True
    batched: bool = True
    prefetch: bool = False
    dynamic_sampling: bool = False
    flat_budget: int = 0
    engine_retries: int = 2

    @classmethod
    def of(cls, config: TrainConfig, pipeline: str | None = None) -> Schedule:
        """The schedule ``config`` asks for (``pipeline`` overrides ``config.pipeline``).

        ``sync`` is ``max_staleness: 0`` with the step's rows started together and prefetched
        behind the gate when ``prefetch_rollouts`` is on; ``fully_async`` admits row by row
        within ``fully_async``'s bounds.
        """
        sampling = config.algorithm.dynamic_sampling
        common = {
            "batch_size": config.data.batch_size, "n": config.rollout.n,
            "concurrency": config.rollout.concurrency, "dynamic_sampling": sampling.enabled,
            # Dynamic sampling: at most max_extra_rounds batches' worth of rows without signal.
            "flat_budget": sampling.max_extra_rounds * config.data.batch_size
            if sampling.enabled else 0,
        }  # fmt: skip
        if (pipeline or config.pipeline) == "sync":
            return cls(**common, prefetch=config.prefetch_rollouts)
        settings = config.fully_async
        return cls(
            **common, max_staleness=settings.max_staleness, sync_every=settings.sync_every,
            retry_stale=settings.on_stale == "retry", batched=False,
        )  # fmt: skip

    def queue_capacity(self) -> int:
        """Finished groups the queue holds: every group the staleness bound lets wait."""
        return self.batch_size * (self.max_staleness + 1)

    def is_stale(self, staleness: int) -> bool:
        """Whether a group ``staleness`` updates old may not be trained."""
        return staleness > self.max_staleness

    def pushes_after(self, step: int) -> bool:
        """Whether the trainer pushes its weights after update ``step`` (0-based)."""
        return (step + 1) % self.sync_every == 0

    def idle_until_push(self, step: int) -> bool:
        """Whether no token is sampled on the served weights from update ``step`` until the
        push after it: on-policy, the next rows wait for the new weights."""
        return self.max_staleness == 0 and self.pushes_after(step)


def rows_to_admit(schedule: Schedule, live_groups: int, in_flight: int, served_step: int) -> int:
    """How many rows may start now (0: none).

    A group started while the engines serve the weights of step ``served_step`` and trained at
    step ``k`` is ``k - served_step`` updates stale. Groups are trained ``batch_size`` per step
    in about the order they start, so at most ``(served_step + max_staleness + 1) *
    batch_size`` groups may ever have been started and not dropped (``live_groups``: trained,
    queued or in flight); AReaL bounds its rollouts the same way. A group that finishes out of
    order can still arrive too late; the trainer checks every group when it takes it.

    Batched, every row the bound allows starts at once (the rollout batch bounds its own
    concurrency); otherwise one row at a time while its ``n`` rollouts fit in
    ``concurrency`` beside the ``in_flight`` groups.
    """
    room = (served_step + schedule.max_staleness + 1) * schedule.batch_size - live_groups
    if room <= 0:
        return 0
    if schedule.batched:
        return room
    return int(in_flight == 0 or (in_flight + 1) * schedule.n <= schedule.concurrency)


def seed_step(index: int, batch_size: int) -> int:
    """The step whose sampling seed the row admitted ``index``-th uses: the step that would
    train it if every group were trained in order. A resumed or retried row keeps its index,
    so it draws the samples it would have drawn."""
    return index // batch_size


def rollout_config(config: TrainConfig, step: int) -> RolloutConfig:
    """The rollout config for ``step``'s seed: a seeded run draws new samples each step, and a
    resumed run draws exactly the samples the uninterrupted run would have."""
    sampling = config.rollout.sampling
    if sampling.seed is None:
        return config.rollout
    seeded = sampling.model_copy(update={"seed": sampling.seed + step})
    return config.rollout.model_copy(update={"sampling": seeded})


def sampled_steps(trajectories: Iterable[Trajectory], policies: Sequence[str]) -> list[int]:
    """The trainer steps whose weights sampled the trained tokens of ``policies``, sorted: a
    token's policy version is the updates its weights had seen (the driver's push version)."""
    return sorted({v for t in trajectories for s in t.trained_segments if s.policy in policies
                   for v, m in zip(s.response_versions, s.response_mask, strict=True) if m})


def staleness_metrics(staleness: Sequence[int]) -> dict[str, float]:
    """Histogram (``staleness/<k>``: groups trained ``k`` updates late), mean and max."""
    if not staleness:
        return {}
    counts = Counter(staleness)
    metrics = {f"staleness/{k}": float(c) for k, c in sorted(counts.items())}
    metrics["staleness/mean"] = sum(staleness) / len(staleness)
    metrics["staleness/max"] = float(max(staleness))
    return metrics


def dynamic_sampling_metrics(schedule: Schedule, with_signal: int, flat: int) -> dict[str, float]:
    """An update's dynamic-sampling counts: the rows it sampled, those with signal, and the
    extra batches' worth of rows it took to fill the batch (none when it is off)."""
    if not schedule.dynamic_sampling:
        return {}
    return {
        "count/rows_sampled": float(with_signal + flat),
        "dynamic_sampling/rows_with_signal": float(with_signal),
        "dynamic_sampling/extra_rounds": float(math.ceil(flat / schedule.batch_size)),
    }
