"""TorchEngine's prefix cache: a group's shared prompt prefilled once, a tool loop's next call
prefilling only its new tokens; the same greedy tokens and logprobs as without the cache."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.torch.prefix_cache import BLOCK_TOKENS, PrefixCache
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import ID_VOCAB, hf_greedy, id_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def model():
    return id_model(0)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, ID_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_shared_prompts_and_continued_contexts_reuse_keys_with_the_same_outputs(model):
    system = _ids(40, 1)  # a system prompt every request shares
    group = [system + _ids(5 + i, 10 + i) for i in range(4)]
    cached = TorchEngine(model, prefix_cache_mb=64)
    try:
        first = await asyncio.gather(*(cached.generate(p, GREEDY, f"a{i}")
                                       for i, p in enumerate(group)))  # fmt: skip
        prefixes = cached._scheduler.prefixes
        assert prefixes.hit_tokens >= 4 * 32  # the shared 40 tokens, in whole blocks
        # The next call of a tool loop: its context, the answer, a tool result, and more.
        follow = [p + r.token_ids + _ids(6, 20 + i) for i, (p, r) in enumerate(zip(group, first))]
        before = prefixes.hit_tokens
        second = await asyncio.gather(*(cached.generate(p, GREEDY, f"b{i}")
                                        for i, p in enumerate(follow)))  # fmt: skip
        assert prefixes.hit_tokens - before >= sum(
            (len(p) + len(r.token_ids) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
            for p, r in zip(group, first, strict=True)
        )  # each reused its own first call (all but the token sampled last)
    finally:
        cached.close()
    plain = TorchEngine(model)
    try:
        for prompt, result in zip(group + follow, first + second, strict=True):
            assert result.token_ids == hf_greedy(model, prompt, GREEDY.max_tokens)
            want = await plain.generate(prompt, GREEDY, "plain")
            assert result.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    finally:
        plain.close()


async def test_new_weights_empty_the_cache(model):
    engine = TorchEngine(model, prefix_cache_mb=64)
    try:
        prompt = _ids(40, 3)
        await engine.generate(prompt, GREEDY, "a")
        assert len(engine._scheduler.prefixes) == 1
        await engine.load_weights(StateDict(id_model(seed=1).state_dict()), 1)
        assert len(engine._scheduler.prefixes) == 0
    finally:
        engine.close()


def test_the_byte_budget_evicts_the_least_recently_used():
    kv = [torch.zeros(2, 32, 4)]  # one layer, 2 heads, 32 tokens, dim 4: 1 KiB
    cache = PrefixCache(max_bytes=2 * 2 * kv[0].numel() * 4)  # two entries' keys and values
    a, b, c = _ids(33, 1), _ids(33, 2), _ids(33, 3)
    cache.insert(None, a[:32], kv, kv)
    cache.insert(None, b[:32], kv, kv)
    assert cache.lookup(None, a).length == 32  # a is now the most recent
    cache.insert(None, c[:32], kv, kv)  # evicts b
    assert cache.lookup(None, b) is None and cache.lookup(None, c).length == 32
    assert cache.lookup("other-adapter", a) is None  # entries belong to their weights
    assert cache.lookup(None, a[:32]).length == 16  # the last token is always prefilled


def _hit_tensor(hit, which: str, layer: int = 0) -> torch.Tensor:
    keys, _ = hit.parts[0]
    out = torch.full((keys[layer].shape[0], hit.length, keys[layer].shape[2]), float("nan"))
    hit.write(which, layer, out)
    return out


def test_entries_store_only_what_no_other_entry_holds():
    system = _ids(32, 5)
    rows = [system + _ids(40, 10 + i) for i in range(3)]  # 72 tokens: 64 in whole blocks
    kv = {i: torch.randn(2, 72, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)}
    for kv_i in kv.values():  # every row computed the same keys for the shared prompt
        kv_i[:, :32] = kv[0][:, :32]
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert(None, system, [kv[0][:, :32].clone()], [-kv[0][:, :32]])
    for i, row in enumerate(rows):
        padded = torch.zeros(2, 172, 4)  # the row as it sits in a padded batch
        padded[:, 100:] = kv[i]
        cache.insert(None, row, [padded[:, 100:]], [-padded[:, 100:]])
    per_token = 2 * 4 * 4 * 2  # heads x dim x float32, keys and values
    assert cache.nbytes == per_token * (32 + 3 * 32)  # the shared prompt once
    for i, row in enumerate(rows):
        hit = cache.lookup(None, row + [7])
        assert hit.length == 64 and len(hit.parts) == 2  # the prompt's, then its own
        assert torch.equal(_hit_tensor(hit, "keys"), kv[i][:, :64])
        assert torch.equal(_hit_tensor(hit, "values"), -kv[i][:, :64])
    cache.insert(None, rows[0], [kv[0]], [-kv[0]])  # held already: nothing copied
    assert cache.nbytes == per_token * (32 + 3 * 32)


def test_a_base_outlives_the_entries_built_on_it():
    system = _ids(32, 6)
    rows = [system + _ids(32, 20 + i) for i in range(4)]
    kv = [torch.randn(2, 64, 4)]
    cache = PrefixCache(max_bytes=2 * 4 * 4 * 2 * (32 + 2 * 32))  # the prompt and two rows
    cache.insert(None, system, [kv[0][:, :32].clone()], [kv[0][:, :32].clone()])
    for row in rows:  # each insert touches the prompt: the older rows leave, never the prompt
        cache.insert(None, row, kv, kv)
        assert cache.lookup(None, system + [1]).length == 32
    assert [cache.cached_length(None, row + [1]) for row in rows] == [32, 32, 64, 64]
    assert torch.equal(_hit_tensor(cache.lookup(None, rows[3] + [1]), "keys"), kv[0])


@pytest.mark.parametrize("prefix_cache_mb", [0, 64])
async def test_max_prefill_tokens_bounds_every_prefill_and_changes_no_token(model, monkeypatch,
                                                                             prefix_cache_mb):
    """Prefills are split to fit the budget (padding counted; a group's shared prompt once);
    the greedy tokens are those of one unbounded prefill."""
    from agentrl_sdk.engines.torch.scheduler import Scheduler

    widths: list[int] = []
    forward = Scheduler._forward

    def recording(self, rows, **inputs):
        if inputs["input_ids"].shape[1] > 1:  # a prefill (decode steps feed one token)
            widths.append(inputs["input_ids"].numel())
        return forward(self, rows, **inputs)

    monkeypatch.setattr(Scheduler, "_forward", recording)
    group = _ids(20, 5)  # 4 samples of one prompt: prefilled once, counted once
    prompts = [group] * 4 + [_ids(12 + i, 30 + i) for i in range(6)] + [_ids(60, 40)]
    bounded = TorchEngine(model, max_prefill_tokens=48, prefix_cache_mb=prefix_cache_mb)
    try:
        got = await asyncio.gather(*(bounded.generate(p, GREEDY, f"r{i}")
                                     for i, p in enumerate(prompts)))  # fmt: skip
    finally:
        bounded.close()
    assert max(widths) == 60  # the 60-token prompt alone: longer than the budget, still served
    assert sorted(widths)[-2] <= 48 and len(widths) >= 4
    for prompt, result in zip(prompts, got, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, GREEDY.max_tokens)


def test_max_prefill_tokens_is_refused_below_one(model):
    with pytest.raises(ValueError, match="max_prefill_tokens must be >= 1"):
        TorchEngine(model, max_prefill_tokens=0)


async def test_dropping_the_cache_frees_it_keeps_a_pause_and_changes_no_token(model, caplog):
    from agentrl_sdk.engines import EnginePool
    from agentrl_sdk.engines.base import drop_prefix_caches

    engine = TorchEngine(model, prefix_cache_mb=64)
    pool = EnginePool([TorchEngine(model, prefix_cache_mb=64), TorchEngine(model)])
    closed = TorchEngine(model, prefix_cache_mb=64)
    closed.close()
    prompt = _ids(40, 4)
    try:
        first = await engine.generate(prompt, GREEDY, "a")
        await pool.generate(prompt, GREEDY, "a", session_id="s")
        cached = [e._scheduler.prefixes for e in (engine, pool.replicas[0])]
        assert all(c.nbytes > 0 for c in cached)
        await engine.pause()
        await drop_prefix_caches([engine, pool, closed, object()])  # the last: no cache kept
        assert [(len(c), c.nbytes) for c in cached] == [(0, 0), (0, 0)]
        assert "TorchEngine kept its prefix cache" in caplog.text  # the closed one: logged only
        waiting = asyncio.ensure_future(engine.generate(prompt, GREEDY, "b"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # still paused
        await engine.resume()
        again = await asyncio.wait_for(waiting, 30)
        assert (again.token_ids, again.logprobs) == (first.token_ids, first.logprobs)
    finally:
        engine.close()
        pool.close()
