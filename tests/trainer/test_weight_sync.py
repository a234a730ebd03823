"""WeightSync with a fake weight source and fake engines: assembly, concurrency, version barrier."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrl_sdk.engines.lora_weights import AdapterWeights
from agentrl_sdk.trainer import WeightSync, WeightSyncError


class FakeSource:
    def __init__(self):
        self.tied = torch.ones(2, 3)
        self.bucket_sizes = []

    def full_state_dict(self, bucket_bytes=0):
        self.bucket_sizes.append(bucket_bytes)
        yield {"a": torch.zeros(4), "emb": self.tied, "head": self.tied}
        yield {"b": torch.arange(3.0)}


class FakeEngine:
    def __init__(self, version=0, fail=False, delay=0.05):
        self.version, self.fail, self.delay = version, fail, delay
        self.loaded = None
        self.running = 0
        self.peak = 0

    async def update_weights(self, state_dict):
        self.running += 1
        await asyncio.sleep(self.delay)
        self.running -= 1
        if self.fail:
            raise RuntimeError("boom")
        self.loaded = dict(state_dict)
        self.version += 1
        return self.version


async def test_push_assembles_buckets_and_bumps_versions():
    source, engines = FakeSource(), [FakeEngine(), FakeEngine()]
    sync = WeightSync(bucket_bytes=1234)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await sync.push(source, engines) == [1, 1]
    assert loop.time() - start < 0.09  # the two 50 ms loads ran concurrently
    assert source.bucket_sizes == [1234]
    for engine in engines:
        assert sorted(engine.loaded) == ["a", "b", "emb", "head"]
        assert torch.equal(engine.loaded["b"], torch.arange(3.0))
    stats = sync.last_stats
    assert (stats.version, stats.engines, stats.tensors, stats.buckets) == (1, 2, 4, 2)
    assert stats.bytes == (4 + 6 + 3) * 4  # the tied tensor counts once
    assert stats.total_s >= stats.load_s > 0
    assert set(stats.as_metrics()) >= {"weight_sync/total_s", "weight_sync/bytes"}


async def test_diverging_versions_raise():
    with pytest.raises(WeightSyncError, match=r"different policy versions.*\[1, 4\]"):
        await WeightSync().push(FakeSource(), [FakeEngine(0), FakeEngine(3)])


async def test_engine_failure_raises():
    with pytest.raises(WeightSyncError, match="boom"):
        await WeightSync().push(FakeSource(), [FakeEngine(), FakeEngine(fail=True)])


async def test_timeout_raises():
    with pytest.raises(WeightSyncError, match="within"):
        await WeightSync(timeout_s=0.01).push(FakeSource(), [FakeEngine(delay=1.0)])


class AdapterSource(FakeSource):
    def adapter_weights(self):
        return AdapterWeights({
            "base_model.model.m.lora_A.weight": torch.zeros(2, 3),
            "base_model.model.m.lora_B.weight": torch.zeros(4, 2),
        }, scaling=2.0)  # fmt: skip


class FakeAdapterEngine(FakeEngine):
    adapter = None
    takes_adapters = True

    async def update_adapter(self, adapter):
        self.adapter = adapter
        self.version += 1
        return self.version


async def test_adapter_push_only_when_every_engine_takes_adapters(caplog):
    engines = [FakeAdapterEngine(), FakeAdapterEngine()]
    sync = WeightSync()
    assert await sync.push(AdapterSource(), engines) == [1, 1]
    assert all(e.loaded is None and e.adapter.scaling == 2.0 for e in engines)
    assert sync.last_stats.adapter and sync.last_stats.bytes == (6 + 8) * 4
    assert list(engines[0].adapter.by_weight()) == ["m.weight"]
    off = FakeAdapterEngine()
    off.takes_adapters = False  # e.g. a VLLMEngine started without enable_lora
    mixed = [FakeAdapterEngine(), FakeEngine(), off]
    assert await sync.push(AdapterSource(), mixed) == [1, 1, 1]
    assert not sync.last_stats.adapter and mixed[0].adapter is None
    assert sorted(mixed[0].loaded) == ["a", "b", "emb", "head"]
    assert "take no adapters" in caplog.text


class StagingSource(FakeSource):
    """A source that can stage files, on a host of the test's choosing."""

    def __init__(self, host):
        super().__init__()
        self.staging_host = host
        self.staged = 0

    def stage_weights(self, bucket_bytes=0):
        self.staged += 1
        raise AssertionError("the engines cannot map this host's files: no staging expected")


class MappingEngine(FakeEngine):
    shared_weights_host = "host-a"

    async def update_shared_weights(self, weights):
        raise AssertionError("not called in this test")


async def test_push_goes_through_this_process_when_an_engine_cannot_map_the_files():
    source = StagingSource("host-b")  # rank 0 writes on another machine than the engines map
    engines = [MappingEngine(), FakeEngine()]
    sync = WeightSync(bucket_bytes=1234)
    assert await sync.push(source, engines) == [1, 1]
    assert source.staged == 0 and sync.last_stats.via == "driver"
    assert sorted(engines[0].loaded) == ["a", "b", "emb", "head"]


def test_shared_weights_round_trip_with_tied_tensors(tmp_path):
    from safetensors import safe_open

    from agentrl_sdk.engines.shared_weights import (
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
    from agentrl_sdk.engines.shared_weights import (
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
    finally:
        remove_stage_folder(folder)


def test_stage_folders_of_dead_processes_are_swept():
    import subprocess
    from pathlib import Path

    from agentrl_sdk.engines.shared_weights import make_stage_folder, remove_stage_folder, shm_root

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
