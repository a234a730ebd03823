"""WeightSync with a fake weight source and fake engines: the kind chosen, concurrency, the
driver's version."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrl_sdk.trainer import StateDictSource, WeightSync, WeightSyncError
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import StateDict, WeightIntake


class FakeSource:
    """Streams its weights through the driver only, in two buckets (one tied tensor)."""

    kinds = frozenset({"state_dict"})
    staging_host = None

    def __init__(self):
        self.tied = torch.ones(2, 3)
        self.exports = []
        self.dtypes = []

    @property
    def weight_offer(self):
        return WeightIntake(self.kinds, self.staging_host)

    def export_weights(self, kind, bucket_bytes, audience, dtype, changed_only=False):
        self.exports.append((kind, bucket_bytes, len(audience)))
        self.dtypes.append(dtype)
        if kind == "adapter":
            return AdapterWeights({
                "base_model.model.m.lora_A.weight": torch.zeros(2, 3),
                "base_model.model.m.lora_B.weight": torch.zeros(4, 2),
            }, scaling=2.0)  # fmt: skip
        assert kind == "state_dict", kind
        state = {"a": torch.zeros(4), "emb": self.tied, "head": self.tied, "b": torch.arange(3.0)}
        return StateDict(state, buckets=2)

    def send_weights(self, push):
        pass


class FakeEngine:
    """Takes the kinds it is given; records what it loaded."""

    def __init__(
        self, version=0, fail=False, delay=0.05, kinds=("state_dict",), host=None, dtype=None
    ):
        self.policy_version, self.fail, self.delay = version, fail, delay
        self.weight_intake = WeightIntake(frozenset(kinds), host, dtype)
        self.loaded = self.adapter = None
        self.keep_version = False

    async def load_weights(self, push, version):
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("boom")
        if isinstance(push, AdapterWeights):
            self.adapter = push
        else:
            self.loaded = dict(push.state_dict())
        if not self.keep_version:
            self.policy_version = version

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        raise AssertionError("not called")

    async def pause(self):
        pass

    async def resume(self):
        pass

    async def health(self):
        return True

    def close(self):
        pass


async def test_push_loads_every_engine_concurrently_as_the_drivers_version():
    source, engines = FakeSource(), [FakeEngine(), FakeEngine(version=3)]
    sync = WeightSync(bucket_bytes=1234)
    loop = asyncio.get_running_loop()
    start = loop.time()
    stats = await sync.push(source, engines, 7)
    assert loop.time() - start < 0.09  # the two 50 ms loads ran concurrently
    assert source.exports == [("state_dict", 1234, 2)]
    assert [e.policy_version for e in engines] == [7, 7]  # whatever each counted before
    for engine in engines:
        assert sorted(engine.loaded) == ["a", "b", "emb", "head"]
        assert torch.equal(engine.loaded["b"], torch.arange(3.0))
    assert stats is sync.last_stats and stats.via == "driver"
    assert (stats.version, stats.engines, stats.tensors, stats.buckets) == (7, 2, 4, 2)
    assert stats.bytes == (4 + 6 + 3) * 4  # the tied tensor counts once
    assert stats.total_s >= stats.load_s > 0


async def test_full_weights_come_in_the_dtype_every_engine_serves():
    source = FakeSource()
    await WeightSync().push(source, [FakeEngine(dtype="bfloat16")] * 2, 1)
    await WeightSync().push(source, [FakeEngine(dtype="bfloat16"), FakeEngine()], 2)
    assert source.dtypes == ["bfloat16", None]  # engines that differ each cast their own
    tensors = {"w": torch.tensor([1.0 + 2**-10]), "ids": torch.arange(3)}
    engine = FakeEngine(dtype="bfloat16")
    await WeightSync().push(StateDictSource(tensors), [engine], 1)
    assert engine.loaded["w"].dtype == torch.bfloat16 and engine.loaded["w"].item() == 1.0
    assert torch.equal(engine.loaded["ids"], torch.arange(3))  # integers stay as they are


async def test_an_engine_reporting_another_version_raises():
    lagging = FakeEngine()
    lagging.keep_version = True
    with pytest.raises(WeightSyncError, match=r"versions \[1, 0\] after loading version 1"):
        await WeightSync().push(FakeSource(), [FakeEngine(), lagging], 1)


async def test_engine_failure_raises():
    with pytest.raises(WeightSyncError, match="boom"):
        await WeightSync().push(FakeSource(), [FakeEngine(), FakeEngine(fail=True)], 1)


async def test_timeout_raises():
    with pytest.raises(WeightSyncError, match="within"):
        await WeightSync(timeout_s=0.01).push(FakeSource(), [FakeEngine(delay=1.0)], 1)


async def test_an_engine_without_load_weights_is_refused_with_what_to_add():
    class OldEngine:  # the protocol before the weight handoff: update_weights(state_dict)
        policy_version = 0

        async def update_weights(self, state_dict):
            return 1

    with pytest.raises(WeightSyncError, match=r"OldEngine.*load_weights\(push, version\)"):
        await WeightSync().push(FakeSource(), [OldEngine()], 1)


async def test_no_kind_both_sides_take_is_refused():
    with pytest.raises(WeightSyncError, match=r"makes \['state_dict'\].*take \[\]"):
        await WeightSync().push(FakeSource(), [FakeEngine(kinds=())], 1)


class AdapterSource(FakeSource):
    kinds = frozenset({"state_dict", "adapter"})


async def test_adapter_push_only_when_every_engine_takes_adapters(caplog):
    both = ("state_dict", "adapter")
    engines = [FakeEngine(kinds=both), FakeEngine(kinds=both)]
    sync = WeightSync()
    await sync.push(AdapterSource(), engines, 1)
    assert all(e.loaded is None and e.adapter.scaling == 2.0 for e in engines)
    assert sync.last_stats.adapter and sync.last_stats.bytes == (6 + 8) * 4
    assert list(engines[0].adapter.by_weight()) == ["m.weight"]
    mixed = [FakeEngine(kinds=both), FakeEngine()]  # e.g. a VLLMEngine without enable_lora
    await sync.push(AdapterSource(), mixed, 2)
    assert not sync.last_stats.adapter and mixed[0].adapter is None
    assert sorted(mixed[0].loaded) == ["a", "b", "emb", "head"]
    assert "take none" in caplog.text


class StagingSource(FakeSource):
    """A source that stages files on a host of the test's choosing (never here)."""

    kinds = frozenset({"state_dict", "shared_files"})

    def __init__(self, host):
        super().__init__()
        self.staging_host = host


async def test_push_goes_through_this_process_when_an_engine_cannot_map_the_files():
    source = StagingSource("host-b")  # rank 0 writes on another machine than the engines map
    mapping = ("state_dict", "shared_files")
    engines = [FakeEngine(kinds=mapping, host="host-a"), FakeEngine()]
    sync = WeightSync(bucket_bytes=1234)
    await sync.push(source, engines, 1)
    assert [k for k, _, _ in source.exports] == ["state_dict"] and sync.last_stats.via == "driver"
    assert sorted(engines[0].loaded) == ["a", "b", "emb", "head"]
    engines = [FakeEngine(kinds=mapping, host="host-b")]  # where the files are: staged
    with pytest.raises(AssertionError, match="shared_files"):
        await WeightSync().push(source, engines, 2)


def test_pushes_pickle_their_tensors_as_arrays():
    import pickle

    tied = torch.arange(6.0).reshape(2, 3)
    push = pickle.loads(pickle.dumps(StateDict({"emb": tied, "head": tied}, buckets=3)))
    assert push.buckets == 3 and torch.equal(push.tensors["emb"], tied)
    assert push.tensors["emb"] is push.tensors["head"]  # tied keys stay one tensor
    adapter = AdapterWeights({"base_model.model.m.lora_A.weight": torch.ones(2, 3)}, 0.5,
                             frozenset({"m.weight"}), "a")  # fmt: skip
    back = pickle.loads(pickle.dumps(adapter))
    assert (back.scaling, back.fan_in_fan_out, back.name) == (0.5, frozenset({"m.weight"}), "a")
    assert torch.equal(back.tensors["base_model.model.m.lora_A.weight"], torch.ones(2, 3))


def test_shared_weights_round_trip_with_tied_tensors(tmp_path):
    from safetensors import safe_open

    from agentrl_sdk.weights.shared_files import (
        SharedWeights,
        host_id,
        make_stage_folder,
        remove_stage_folder,
        write_bucket_file,
    )

    tied = torch.arange(6.0).reshape(2, 3)
    folder = make_stage_folder()
    try:
        first = f"{folder}/bucket-00000.safetensors"
        second = f"{folder}/bucket-00001.safetensors"
        assert write_bucket_file({"emb": tied, "head": tied}, first) == 6 * 4  # tied: once
        with safe_open(first, framework="pt") as f:
            assert list(f.keys()) == ["emb"]  # stored once, "head" restored on reading
        assert write_bucket_file({"b": torch.ones(4, dtype=torch.bfloat16)}, second) == 8
        weights = SharedWeights(host_id(), folder, (first, second), tensors=3, nbytes=32)
        state = weights.state_dict()
        assert sorted(state) == ["b", "emb", "head"]
        assert torch.equal(state["emb"], tied) and torch.equal(state["head"], tied)
        assert state["b"].dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="cannot be mapped"):
            SharedWeights("elsewhere/0", folder, (first,), 2, 48).state_dict()
    finally:
        remove_stage_folder(folder)
    assert not (tmp_path / folder).exists()
    with pytest.raises(ValueError, match="not a weight staging folder"):
        remove_stage_folder(tmp_path)


def test_staged_file_is_overwritten_in_place_and_read_afresh():
    from agentrl_sdk.weights.shared_files import (
        SharedWeights,
        StagedFile,
        host_id,
        make_stage_folder,
        remove_stage_folder,
    )

    tied = torch.zeros(2, 3)
    folder = make_stage_folder()
    try:
        path = f"{folder}/bucket-00000.safetensors"
        staged = StagedFile(path, {"emb": tied, "head": tied, "b": torch.zeros(3, dtype=torch.bfloat16)})
        weights = SharedWeights(host_id(), folder, (path,), tensors=3, nbytes=staged.nbytes)
        assert torch.equal(weights.state_dict()["emb"], tied)
        new = torch.arange(6.0).reshape(2, 3)
        nbytes = staged.overwrite({"emb": new, "head": new, "b": torch.ones(3, dtype=torch.bfloat16)})
        assert nbytes == 6 * 4 + 3 * 2
        state = weights.state_dict()  # a reader maps the same file again: the new values
        assert torch.equal(state["emb"], new) and torch.equal(state["head"], new)
        assert torch.equal(state["b"], torch.ones(3, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="other tensors"):
            staged.overwrite({"emb": new})
        with pytest.raises(ValueError, match="other tensors"):  # no longer tied
            staged.overwrite({"emb": new, "head": new.clone(), "b": torch.ones(3)})
        with pytest.raises(ValueError, match="other tensors"):  # another dtype: not cast
            staged.overwrite({"emb": new, "head": new, "b": torch.ones(3)})
    finally:
        remove_stage_folder(folder)


def test_stage_folders_of_dead_processes_are_swept():
    import subprocess
    from pathlib import Path

    from agentrl_sdk.weights.shared_files import make_stage_folder, remove_stage_folder, shm_root

    exited = subprocess.Popen(["true"])
    exited.wait()
    stale = Path(shm_root() or "/tmp") / f"agentrl-weights-{exited.pid}-x"
    stale.mkdir()
    first = make_stage_folder()
    second = make_stage_folder()  # a live process's folder is never swept
    try:
        assert not stale.exists()
        assert Path(first).is_dir() and Path(first).name.startswith(f"agentrl-weights-{os.getpid()}-")
    finally:
        remove_stage_folder(first)
        remove_stage_folder(second)
