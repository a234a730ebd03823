"""WeightSync with a fake weight source and fake engines: assembly, concurrency, version barrier."""

from __future__ import annotations

import asyncio

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
