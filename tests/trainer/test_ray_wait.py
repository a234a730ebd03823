"""`wait_ranks` on real Ray actors: a rank that died is reported as `RankDiedError` (the group
rebuilds from it) even when a living rank's failure, caused by that death, arrives first."""

from __future__ import annotations

import os
import signal
import time

import pytest

from agentrl_sdk.trainer.errors import RankDiedError, TrainerError
from agentrl_sdk.trainer.ray_cluster import wait_ranks


@pytest.fixture(scope="module")
def ranks(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class Rank:
        def fail(self) -> None:
            raise RuntimeError("Read error [127.0.0.1]:1: Connection reset by peer")

        def die_after(self, delay_s: float) -> None:
            time.sleep(delay_s)
            os.kill(os.getpid(), signal.SIGKILL)

    def start(n: int) -> list:
        actors = [Rank.remote() for _ in range(n)]
        ray.get([a.__ray_ready__.remote() for a in actors])
        return actors

    return start


def test_a_peer_failure_that_arrives_before_the_death_is_still_a_death(ranks):
    # As when a rank is SIGKILLed in a collective: gloo resets the living rank's connection
    # at once; Ray reports the dead actor a moment later.
    alive, dying = ranks(2)
    refs = [alive.fail.remote(), dying.die_after.remote(0.5)]

    with pytest.raises(RankDiedError, match=r"rank 1 died during stage.*rank 0 then failed: "
                                            r"RuntimeError: Read error"):
        wait_ranks(refs, "stage", timeout=60)


def test_failures_without_a_death_stay_trainer_errors_naming_every_rank(ranks):
    first, second = ranks(2)

    with pytest.raises(TrainerError, match=r"rank (0|1) failed in step: RuntimeError") as raised:
        wait_ranks([first.fail.remote(), second.fail.remote()], "step", timeout=60)
    # Whichever answered first is named; the other is listed.
    other = 1 - int(str(raised.value).split()[2])
    assert str(raised.value).endswith(f"(ranks [{other}] failed too)")
    assert not isinstance(raised.value, RankDiedError)
