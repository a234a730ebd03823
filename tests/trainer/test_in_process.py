"""``trainer.placement: in_process``: the one rank in the test's own process, without Ray. Its
updates equal the single-process reference, as a Ray actor's do; its pushes reach an engine in
the same process; its failures and timeouts name the rank and the call; the settings it cannot
honour are refused at start."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from agentrl_sdk.engines.torch.engine import TorchEngine
from agentrl_sdk.pipeline.config import TrainConfig
from agentrl_sdk.trainer import TrainerConfig, TrainerError, TrainerGroup, WeightSync
from agentrl_sdk.types import Batch, SamplingParams
from tests.trainer.test_trainer_group import (
    BATCHES,
    CONFIG_C,
    LOSS_C,
    Reference,
    full_state,
    max_diff,
)

pytestmark = pytest.mark.slow

TOL = 1e-5
IN_PROCESS = CONFIG_C.model_copy(update={"placement": "in_process", "trainable_layers": 1})


@pytest.fixture(scope="module")
def group(model_path):
    import ray

    assert not ray.is_initialized()  # nothing here may start Ray
    with TrainerGroup(model_path, IN_PROCESS, LOSS_C) as group:
        yield group
    assert not ray.is_initialized()


def test_updates_equal_the_reference_in_this_process(group, model_path):
    assert group.ranks.pids == [os.getpid()]
    # The rank's torch threads are its own thread's: this (the engine's) thread keeps its own.
    assert group.info["threads"] == 1 and torch.get_num_threads() == len(os.sched_getaffinity(0))
    assert group.weights.weight_offer.kinds == {"state_dict", "shared_files"}
    reference = Reference(model_path, IN_PROCESS, LOSS_C)
    from agentrl_sdk.trainer.layers import freeze_all_but_last

    freeze_all_but_last(reference.model, reference.model.model.layers, 1)
    for step in range(2):
        got = group.update(BATCHES[step])
        expected = reference.update(BATCHES[step].samples)
        assert max_diff(full_state(group), reference.state_dict()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        assert (got["optimizer_steps"], got["step"]) == (4, 4 * (step + 1))


async def test_a_push_gives_an_engine_of_this_process_the_trainers_weights(group, model_path):
    engine = TorchEngine.from_pretrained(model_path)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=())
    try:
        sync = WeightSync(bucket_bytes=64 << 10, changed_only=True)
        await sync.push(group.weights, [engine], 1)
        assert sync.last_stats.via == "shared_memory"
        trained, served = full_state(group), engine.model.state_dict()
        assert all(torch.equal(served[k], trained[k]) for k in trained)
        out = await engine.generate([17, 300, 42], greedy, "after")
        assert out.policy_version == 1
    finally:
        engine.close()


def test_failures_and_timeouts_name_the_rank_and_the_call(group, tmp_path):
    with pytest.raises(TrainerError, match=r"rank 0 failed in load_checkpoint: FileNotFoundError"):
        group.load_checkpoint(tmp_path / "missing")
    release = threading.Event()

    def stall(rank: object) -> None:
        release.wait(30)  # a call that does not return

    try:
        with pytest.raises(TrainerError, match=r"stall timed out after 0s waiting for ranks \[0\]"):
            group.ranks.call(stall, timeout=0.2)
    finally:
        release.set()
    assert group.compute_logprobs(Batch(samples=BATCHES[0].samples[:1]))  # still usable


def test_a_second_in_process_trainer_is_refused(group, model_path):
    with pytest.raises(TrainerError, match="already holds a torch.distributed group"):
        TrainerGroup(model_path, IN_PROCESS, LOSS_C)


def test_settings_it_cannot_honour_are_refused_at_start():
    with pytest.raises(ValueError, match=r"world_size > 1, weight_transport 'collective' need"):
        TrainerConfig(placement="in_process", world_size=2, weight_transport="collective")
    with pytest.raises(ValueError, match="would put 2 trainers"):
        TrainConfig.model_validate({
            "trainer": {"placement": "in_process"},
            "algorithm": {"advantage_estimator": "gae"},
        })  # fmt: skip
    critic_on_ray = {"advantage_estimator": "gae"}
    TrainConfig.model_validate({
        "trainer": {"placement": "in_process"}, "algorithm": critic_on_ray,
        "critic": {"trainer": {"placement": "ray"}},
    })  # fmt: skip


def test_a_job_without_ray_never_loads_it_and_a_stuck_call_does_not_hold_it_open(model_path):
    """In a process of its own: an in-process trainer's start, update and push never import
    Ray (its modules cost the job's process memory); the rank's thread is a daemon, so a call
    stuck past its timeout ends with the process."""
    import subprocess
    import sys

    script = (
        "import sys, threading\n"
        "from agentrl_sdk.trainer import TrainerGroup, WeightSync\n"
        "from agentrl_sdk.engines.torch.engine import TorchEngine\n"
        "from tests.trainer.test_in_process import BATCHES, IN_PROCESS, LOSS_C\n"
        f"group = TrainerGroup({str(model_path)!r}, IN_PROCESS, LOSS_C)\n"
        "group.update(BATCHES[0])\n"
        f"engine = TorchEngine.from_pretrained({str(model_path)!r})\n"
        "import asyncio; asyncio.run(WeightSync().push(group.weights, [engine], 1))\n"
        "print('ray loaded', 'ray' in sys.modules, flush=True)\n"
        "group.ranks.submit(lambda rank: threading.Event().wait())\n"
        "print('stuck', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, env=os.environ | {"PYTHONPATH": os.getcwd()})  # fmt: skip
    assert done.returncode == 0 and "stuck" in done.stdout, done.stderr[-2000:]
    assert "ray loaded False" in done.stdout


def test_a_checkpoint_round_trip_of_the_one_rank_runs_no_collective(group, tmp_path, monkeypatch):
    # A collective's copy on a gloo thread starts an OpenMP team there, and the gloo threads
    # outlive the job (torch's DTensor caches keep its process group): the idle team slowed
    # the next job's rollouts in this process 1.25-1.46x.
    import torch.distributed as dist

    called = []
    for name in ("gather_object", "scatter_object_list", "broadcast_object_list",
                 "all_gather_object", "all_reduce", "all_gather", "broadcast", "reduce_scatter"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _n=name, _f=real, **k: (called.append(_n),
                                                                          _f(*a, **k))[1])
    state = full_state(group)
    group.save_checkpoint(tmp_path / "ckpt", extra={"next_row": 3})
    assert group.load_checkpoint(tmp_path / "ckpt") == {"next_row": 3}
    monkeypatch.undo()
    assert called == []
    assert max_diff(full_state(group), state) == 0
