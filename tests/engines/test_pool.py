"""EnginePool over in-process TorchEngines: least-loaded routing, stickiness, failover, weights."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from agentrl_sdk.engines import Engine, EnginePool, TorchEngine
from agentrl_sdk.errors import EngineError
from agentrl_sdk.trainer.weight_sync import StateDictSource, WeightSync
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict, WeightIntake
from tests.engines._tiny import ID_VOCAB, hf_greedy, id_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


class Recorded:
    """A replica that notes every request it serves and the pool's in-flight counts then."""

    def __init__(self, engine: TorchEngine, name: int, log: list) -> None:
        self.engine, self.name, self.log = engine, name, log
        self.pool: EnginePool | None = None

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        self.log.append((self.name, session_id, self.pool.in_flight if self.pool else None))
        return await self.engine.generate(prompt_ids, sampling, request_id)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return id_model(0)


@pytest.fixture
def pool_of(model):
    """Factory: a pool of ``n`` recorded TorchEngine replicas; closes them afterwards."""
    made: list[EnginePool] = []

    def make(n: int, **kwargs) -> tuple[EnginePool, list]:
        log: list = []
        replicas = [
            Recorded(TorchEngine(copy.deepcopy(model), eos_token_ids=()), i, log) for i in range(n)
        ]
        pool = EnginePool(replicas, **kwargs)
        for r in replicas:
            r.pool = pool
        made.append(pool)
        return pool, log

    yield make
    for pool in made:
        pool.close()


async def test_pool_is_an_engine(pool_of) -> None:
    pool, _ = pool_of(2)
    assert isinstance(pool, Engine)
    assert await pool.health()


async def test_least_loaded_by_requests_in_flight_under_skewed_load(pool_of) -> None:
    pool, log = pool_of(2)
    long = SamplingParams(temperature=0.0, max_tokens=100_000)
    short = SamplingParams(temperature=0.0, max_tokens=2)
    # Eight first calls alternate replicas; those on replica 0 are endless, those on 1 short.
    first = []
    for i in range(8):
        sampling = long if i % 2 == 0 else short
        first.append(asyncio.ensure_future(pool.generate([1 + i, 2, 3], sampling, f"warm{i}-0")))
        await asyncio.sleep(0)
    await asyncio.gather(*first[1::2])
    assert [name for name, *_ in log] == [0, 1] * 4
    assert pool.in_flight == [4, 0]  # an ever-growing counter would say 4 and 4
    log.clear()
    burst = [
        asyncio.ensure_future(pool.generate([7, i], long, f"burst{i}-0")) for i in range(8)
    ]
    await asyncio.sleep(0.05)
    try:
        # The burst fills replica 1 first, then alternates: in flight stays within 1.
        assert [name for name, *_ in log] == [1, 1, 1, 1, 0, 1, 0, 1]
        assert max(pool.in_flight) - min(pool.in_flight) <= 1
        assert pool.in_flight == [6, 6]
        assert all(max(seen) - min(seen) <= 4 for _, _, seen in log)
    finally:
        for task in burst + first[0::2]:
            task.cancel()
        await asyncio.gather(*burst, *first[0::2], return_exceptions=True)


async def test_later_calls_of_a_rollout_stick_to_its_replica(pool_of) -> None:
    pool, log = pool_of(3, max_sessions=4)
    for turn in range(3):
        await asyncio.gather(
            *(pool.generate([5, r, turn], GREEDY, f"req-{r}-{turn}", session_id=f"row{r}:0")
              for r in range(4))
        )  # fmt: skip
    by_session: dict[str, set[int]] = {}
    for name, session_id, _ in log:
        by_session.setdefault(session_id, set()).add(name)
    assert by_session.keys() == {f"row{r}:0" for r in range(4)}
    assert all(len(names) == 1 for names in by_session.values())
    assert {next(iter(n)) for n in by_session.values()} == {0, 1, 2}  # all replicas used
    # LRU bound: a fifth session evicts the least recently used one.
    await pool.generate([9], GREEDY, "req-9-0", session_id="row9:0")
    assert pool.replica_of("row0:0") is None
    assert pool.replica_of("row3:0") is not None


async def test_replica_failure_reroutes_without_losing_a_rollout(pool_of, model) -> None:
    pool, log = pool_of(2)
    long = SamplingParams(temperature=0.0, max_tokens=60)
    prompts = {f"r{i}": [11, i + 1, 4, 2] for i in range(6)}  # no 0: HF pads with it
    tasks = {
        rid: asyncio.ensure_future(pool.generate(p, long, f"{rid}-0", session_id=rid))
        for rid, p in prompts.items()
    }
    await asyncio.sleep(0.01)
    on_zero = [rid for rid in prompts if pool.replica_of(rid) == 0]
    assert len(on_zero) == 3
    # Replica 0 dies mid-generation (held by a pause first, so none of its requests can finish).
    await pool.replicas[0].pause()
    await asyncio.to_thread(pool.replicas[0].close)
    results = await asyncio.wait_for(asyncio.gather(*tasks.values()), 120)
    # Every rollout's call completed, restarted from its prompt on the survivor.
    for (rid, prompt), result in zip(prompts.items(), results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 60), rid
    assert pool.reroutes == 3
    assert pool.healthy == [1]
    assert pool.stats() == {"reroutes": 3.0, "drained_replicas": 1.0, "failed_health_checks": 0.0,
                            "restarts": 0.0, "failed_restarts": 0.0}
    # The moved rollouts' next calls go to the survivor.
    await pool.generate([1, 2], GREEDY, f"{on_zero[0]}-1", session_id=on_zero[0])
    assert pool.replica_of(on_zero[0]) == 1


async def test_failure_on_a_healthy_replica_is_raised(pool_of) -> None:
    pool, _ = pool_of(2)
    with pytest.raises(ValueError, match="out of range"):
        await pool.generate([ID_VOCAB + 1], GREEDY, "bad-0")
    pool.replicas[0].close()
    pool.replicas[1].close()
    with pytest.raises(EngineError, match="drained"):
        await pool.generate([1], GREEDY, "late-0")


async def test_check_health_drains_unhealthy_replicas_before_a_request_fails(pool_of) -> None:
    pool, log = pool_of(3, health_timeout_s=0.2)
    await asyncio.gather(*(pool.generate([4, i + 1], GREEDY, f"h{i}-0", session_id=f"h{i}") for i in range(3)))
    session_on = {pool.replica_of(f"h{i}"): f"h{i}" for i in range(3)}
    assert sorted(session_on) == [0, 1, 2]
    assert await pool.check_health() == [0, 1, 2]

    async def hangs() -> bool:
        await asyncio.sleep(60)
        return True

    pool.replicas[1].close()  # dead: health() answers False
    pool.replicas[2].health = hangs  # no answer within health_timeout_s
    assert await pool.check_health() == [0]
    assert pool.healthy == [0]
    assert pool.stats()["failed_health_checks"] == 1.0  # the hung one (logged with its cause)
    assert pool.replica_of(session_on[0]) == 0
    assert pool.replica_of(session_on[1]) is None and pool.replica_of(session_on[2]) is None
    log.clear()
    # The drained replicas' rollouts go on on replica 0; no request had to fail first.
    await asyncio.gather(*(pool.generate([4, 9], GREEDY, f"{session_on[i]}-1", session_id=session_on[i])
                           for i in (1, 2)))
    assert [name for name, *_ in log] == [0, 0]
    assert pool.reroutes == 0
    assert await pool.check_health() == [0]  # drained replicas stay drained


async def test_weight_sync_reaches_every_replica_behind_one_barrier(pool_of, model) -> None:
    pool, log = pool_of(2)
    new_model = id_model(seed=1)
    long = SamplingParams(temperature=0.0, max_tokens=200)
    running = [asyncio.ensure_future(pool.generate([3, i + 1], long, f"w{i}-0")) for i in range(4)]
    await asyncio.sleep(0.05)
    stats = await WeightSync().push(StateDictSource(new_model.state_dict()), [pool], 1)
    results = await asyncio.gather(*running)
    assert stats.version == 1 and stats.via == "driver" and stats.buckets == 1
    assert pool.policy_version == 1
    assert [r.policy_version for r in pool.replicas] == [1, 1]
    for i, result in enumerate(results):
        k = result.versions.count(0)
        assert result.versions == [0] * k + [1] * (200 - k)
        expected = hf_greedy(new_model, [3, i + 1, *result.token_ids[:k]], 200 - k)
        assert result.token_ids[k:] == expected
    after = await asyncio.gather(*(pool.generate([8, i + 1], GREEDY, f"n{i}-0") for i in range(2)))
    assert {name for name, session, _ in log if session.startswith("n")} == {0, 1}
    assert all(r.token_ids == hf_greedy(new_model, [8, i + 1], 8) for i, r in enumerate(after))


@pytest.fixture(scope="module")
def ray_started():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.slow
async def test_pool_over_an_in_process_and_a_ray_actor_replica(ray_started) -> None:
    from agentrl_sdk.engines import create_engine
    from agentrl_sdk.engines.ray import RayEngine
    from tests.engines._tiny import tiny_model_dir

    path = str(tiny_model_dir(0))
    local = create_engine("torch", path, dtype=torch.float32)
    remote = create_engine("torch", path, ray_actors=True, dtype=torch.float32)
    assert isinstance(remote, RayEngine)
    pool = EnginePool([local, remote])
    try:
        prompts = [[5, i + 1, 40] for i in range(4)]
        for turn in range(2):
            results = await asyncio.gather(
                *(pool.generate(p, GREEDY, f"ray{i}:0-{turn}", session_id=f"ray{i}:0")
              for i, p in enumerate(prompts))
            )
            expected = await asyncio.gather(*(local.generate(p, GREEDY, "ref") for p in prompts))
            assert [r.token_ids for r in results] == [r.token_ids for r in expected]
        assert {pool.replica_of(f"ray{i}:0") for i in range(4)} == {0, 1}
        new_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(1), dtype=torch.float32)
        await pool.load_weights(StateDict(new_model.state_dict()), 1)
        assert pool.policy_version == remote.policy_version == local.policy_version == 1
        moved = await asyncio.gather(
            *(pool.generate(p, GREEDY, f"ray{i}:0-2", session_id=f"ray{i}:0")
              for i, p in enumerate(prompts))
        )
        expected = [hf_greedy(new_model, p, 8) for p in prompts]
        assert [r.token_ids for r in moved] == expected
        # The actor dies: its rollouts move to the in-process replica.
        ray_started.kill(remote._actor)
        again = await asyncio.gather(
            *(pool.generate(p, GREEDY, f"ray{i}:0-3", session_id=f"ray{i}:0")
              for i, p in enumerate(prompts))
        )
        assert [r.token_ids for r in again] == expected
        assert pool.healthy == [0]
    finally:
        pool.close()


async def _restarted(pool: EnginePool) -> None:
    """Wait for the pool's rebuild tasks."""
    for _ in range(200):
        if not pool.restarting:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replica was not rebuilt in 10 s")


async def test_a_dead_replica_is_rebuilt_and_rejoins_on_the_pools_weights(model) -> None:
    """Before any update the rebuilt replica serves at once; after one it waits for the next
    push, then serves on it as the driver's version, like the other replica."""
    built: list[int] = []

    def restart(index: int) -> TorchEngine:
        built.append(index)
        return TorchEngine(copy.deepcopy(model), eos_token_ids=())

    pool = EnginePool([restart(0), restart(1)], restart=restart, max_restarts=2)
    built.clear()
    try:
        pool.replicas[0].close()
        await pool.generate([3, 4], GREEDY, "a-0", session_id="a")  # drains 0 if routed there
        await pool.check_health()
        await _restarted(pool)
        assert built == [0] and pool.healthy == [0, 1]  # version 0 = the base: serves at once

        new_model = id_model(1)
        await pool.load_weights(StateDict(new_model.state_dict()), 1)
        assert pool.policy_version == 1
        pool.replicas[1].close()
        await pool.check_health()
        await _restarted(pool)
        assert built == [0, 1] and pool.healthy == [0]  # rebuilt on the base: waits
        assert pool.stats()["restarts"] == 2.0
        await pool.load_weights(StateDict(new_model.state_dict()), 5)  # the driver's version
        assert pool.healthy == [0, 1] and pool.policy_version == 5
        assert [r.policy_version for r in pool.replicas] == [5, 5]  # the rebuilt one too
        prompts = [[7, i + 1, 9] for i in range(4)]
        results = await asyncio.gather(*(
            pool.generate(p, GREEDY, f"s{i}-0", session_id=f"s{i}") for i, p in enumerate(prompts)))
        assert {pool.replica_of(f"s{i}") for i in range(4)} == {0, 1}
        assert [r.token_ids for r in results] == [hf_greedy(new_model, p, 8) for p in prompts]
        assert {r.policy_version for r in results} == {5}  # the driver's version, from both
        # The budget is spent: the next death only drains.
        pool.replicas[0].close()
        await pool.check_health()
        await _restarted(pool)
        assert built == [0, 1] and pool.healthy == [1]
    finally:
        pool.close()


async def test_a_rebuilt_replica_reports_the_drivers_version_of_every_adapter(model) -> None:
    """Named adapters pushed as driver versions 1 (a, then again as 3) and 2 (b): a replica
    rebuilt after them takes b (as 2) and then a's next push (as 6, skipping numbers) when it
    rejoins, so both replicas report exactly the driver's versions for b's, a's and the base's
    requests (2, 6, 0)."""
    from tests.engines.test_row_adapters import peft_adapter

    adapters = {name: peft_adapter(model, seed, name)[1] for name, seed in (("a", 1), ("b", 2))}

    def restart(index: int) -> TorchEngine:
        return TorchEngine(copy.deepcopy(model), eos_token_ids=())

    pool = EnginePool([restart(0), restart(1)], restart=restart, max_restarts=1)
    try:
        for name, version in (("a", 1), ("b", 2), ("a", 3)):
            await pool.load_weights(adapters[name], version)
            assert pool.policy_version == version
            assert [r.policy_version for r in pool.replicas] == [version, version]
        pool.replicas[1].close()
        await pool.check_health()
        await _restarted(pool)
        assert pool.healthy == [0]  # rebuilt on the base: waits for the next push
        await pool.load_weights(adapters["a"], 6)
        assert pool.healthy == [0, 1] and pool.policy_version == 6
        assert [r.policy_version for r in pool.replicas] == [6, 6]  # took b, then a as 6
        for adapter, version in (("b", 2), ("a", 6), (None, 0)):
            sampling = GREEDY.model_copy(update={"adapter": adapter})
            results = await asyncio.gather(*(
                pool.generate([7, i + 1, 9], sampling, f"{adapter}{i}-0", session_id=f"{adapter}{i}")
                for i in range(4)))  # fmt: skip
            assert {pool.replica_of(f"{adapter}{i}") for i in range(4)} == {0, 1}
            assert {r.policy_version for r in results} == {version}, adapter
            assert {v for r in results for v in r.token_versions or []} <= {version}
            # Each replica, asked directly, serves the same tokens as the same version.
            direct = [await r.generate([7, 1, 9], sampling, f"{adapter}-direct{j}")
                      for j, r in enumerate(pool.replicas)]  # fmt: skip
            assert [d.policy_version for d in direct] == [version, version], adapter
            assert direct[0].token_ids == direct[1].token_ids, adapter
    finally:
        pool.close()


def test_pool_weight_intake_is_the_replicas_common_kinds_without_collective(model) -> None:
    """A pool is one receiver: it takes what every replica takes, but no broadcast."""
    from types import SimpleNamespace

    def replica(*kinds: str, host: str | None = "h") -> SimpleNamespace:
        return SimpleNamespace(policy_version=0, weight_intake=WeightIntake(frozenset(kinds), host))

    pool = EnginePool([
        replica("state_dict", "shared_files", "collective", "adapter"),
        replica("state_dict", "shared_files", "object_refs", "collective"),
    ])  # fmt: skip
    assert pool.weight_intake == WeightIntake(frozenset({"state_dict", "shared_files"}), "h")
    mixed_hosts = EnginePool([replica("state_dict", "shared_files"),
                              replica("state_dict", "shared_files", host="other")])  # fmt: skip
    assert mixed_hosts.weight_intake.kinds == frozenset({"state_dict"})

    torch_pool = EnginePool([TorchEngine(copy.deepcopy(model)) for _ in range(2)])
    try:
        assert torch_pool.weight_intake == torch_pool.replicas[0].weight_intake
        assert torch_pool.weight_intake.kinds == frozenset({"state_dict", "shared_files", "adapter"})
        assert isinstance(torch_pool, Engine)
    finally:
        torch_pool.close()
