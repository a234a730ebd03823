"""A job on a two-node Ray cluster: the trainer pinned to one node, the engines to the other,
by custom resources; weights reach the engines' node from the trainer's object store, never
through the driver."""

from __future__ import annotations

import pytest

from agentrl_sdk.engines.ray import RayEngine
from agentrl_sdk.trainer.exports import WeightExports
from agentrl_sdk.trainer.group import TrainerGroup
from tests.pipeline._demo import demo_config, train_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes(monkeypatch):
    """A head node offering ``trainer_node`` and a second node offering ``engine_node``: two
    raylets on this machine, as `ray start --head` and `ray start --address` would start."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_worker_niceness", "0")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"trainer_node": 1}, "include_dashboard": False})
    engines = cluster.add_node(num_cpus=1, resources={"engine_node": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster.address, cluster.head_node.node_id, engines.node_id
    finally:
        cluster.shutdown()


def _spy_on(monkeypatch, cls) -> list:
    """Every instance of ``cls`` built from now on."""
    built, init = [], cls.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(cls, "__init__", record)
    return built


def test_trainer_and_engines_on_their_own_nodes(two_nodes, monkeypatch):
    address, trainer_node, engine_node = two_nodes
    groups, engines = _spy_on(monkeypatch, TrainerGroup), _spy_on(monkeypatch, RayEngine)
    put, puts = WeightExports.put, []

    def counted_put(self, *args, **kwargs):
        puts.append(self)
        return put(self, *args, **kwargs)

    monkeypatch.setattr(WeightExports, "put", counted_put)
    config = demo_config(2)
    # The two nodes share this machine's /dev/shm: as between machines, the pushes go node to
    # node through Ray's object stores.
    config.trainer = config.trainer.model_copy(update={
        "ray_address": address, "resources": {"trainer_node": 1},
        "weight_transport": "object_store"})
    config.engine.ray_actors = True
    config.engine.options = config.engine.options.model_copy(
        update={"actor_options": {"resources": {"engine_node": 1}}})

    result = train_demo(config)

    assert [m["policy_version"] for m in result.history] == [1.0, 2.0]  # pushed to the engine
    assert len(puts) == 2  # by rank 0's object store, not the driver
    assert all(m.get("train/trained_tokens", 0) > 0 or m["train/skipped_no_signal"] == 1
               for m in result.history)  # trained, or no signal: no optimizer step
    (group,) = groups
    assert group.ranks.node_ids == [trainer_node]
    assert [e.node_id for e in engines] == [engine_node]
