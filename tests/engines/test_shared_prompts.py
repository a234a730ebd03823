"""A group's prompt kept once in the decode cache: the attention over the shared prompt plus a
row's own tokens equals attention over the row's whole context, and an engine that shares
prompts returns the same tokens as one that copies them per row, in less memory."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.torch.decode_attention import grouped_decode_attention
from agentrl_sdk.engines.torch.shared_prompts import SharedPrompts, attend_with_shared_prompts
from agentrl_sdk.types import GenerateResult, SamplingParams
from tests.engines._tiny import ID_VOCAB, id_model


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_prompt_attention_equals_attention_over_whole_rows(mask_kind, dtype) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, own_width = 6, 2, 8, 5
    prompt_lengths = [7, 4, 9]  # three groups, left-padded to 9 columns
    groups = [0, 2, 0, -1, 1, 0, 2]  # row 3 has no group: its whole context is its own
    batch, width = len(groups), max(prompt_lengths)
    prompt_keys, prompt_values = torch.randn(2, len(prompt_lengths), kv_heads, width, dim)
    prompt_mask = torch.zeros(len(prompt_lengths), width, dtype=torch.bool)
    for g, n in enumerate(prompt_lengths):
        prompt_mask[g, width - n :] = True
    own_keys, own_values = torch.randn(2, batch, kv_heads, own_width, dim)
    own_allowed = torch.ones(batch, 1, 1, own_width, dtype=torch.bool)
    own_allowed[1, ..., :2] = False  # a row that joined after wider ones: a gap
    own_allowed[3, ..., :1] = False
    own_mask = own_allowed if mask_kind == "bool" else (
        torch.zeros(own_allowed.shape).masked_fill(~own_allowed, -1e30)
    )
    query = torch.randn(batch, heads, 1, dim)
    cast = [t.to(dtype) for t in (query, prompt_keys, prompt_values, own_keys, own_values)]
    query, prompt_keys, prompt_values, own_keys, own_values = cast

    members = torch.tensor([0, 0, 1, 0, 0, 2, 1])  # each row's place in its group
    shared = SharedPrompts(
        [prompt_keys], [prompt_values], prompt_mask, torch.tensor(groups), members
    )
    out = attend_with_shared_prompts(
        query, own_keys, own_values, own_mask, dim**-0.5, shared.view(), layer=0
    )

    # The reference: every row its own copy of its group's prompt, then its own columns.
    whole_keys = torch.cat([prompt_keys[torch.tensor(groups).clamp(min=0)], own_keys], dim=2)
    whole_values = torch.cat([prompt_values[torch.tensor(groups).clamp(min=0)], own_values], dim=2)
    index = torch.tensor(groups)
    sees_prompt = prompt_mask[index.clamp(min=0)] & (index >= 0)[:, None]
    whole_mask = torch.cat([sees_prompt[:, None, None, :], own_allowed], dim=-1)
    expected = grouped_decode_attention(query, whole_keys, whole_values, whole_mask, dim**-0.5)
    assert out.shape == (batch, 1, heads, dim)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_rows_leaving_drop_prompts_no_row_uses() -> None:
    keys = [torch.arange(3.0)[:, None, None, None].expand(3, 1, 4, 2).clone()]
    shared = SharedPrompts.of_prefill(keys, keys, torch.ones(3, 4), [0, 0, 1, 2, 2])
    assert shared.members.tolist() == [0, 1, 0, 0, 1]
    shared.select([0, 1, 3])  # group 1 left; 2 of 3 prompts still used: kept as they are
    assert shared.groups.tolist() == [0, 0, 2] and shared.keys[0].shape[0] == 3
    shared.select([2])  # only group 2's row: the others' prompts go
    assert shared.groups.tolist() == [0] and shared.keys[0].shape[0] == 1
    assert float(shared.keys[0][0, 0, 0, 0]) == 2.0


async def _generate_all(
    engine: TorchEngine, jobs: list[tuple[list[int], SamplingParams]], stagger: float
) -> list[GenerateResult]:
    async def one(i: int, prompt: list[int], sampling: SamplingParams) -> GenerateResult:
        await asyncio.sleep(stagger * (i // 4))  # groups of rows arrive together, later ones later
        return await engine.generate(prompt, sampling, f"r{i}")

    return await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(jobs)))


def _group_jobs(prompts: list[list[int]], greedy: bool) -> list[tuple[list[int], SamplingParams]]:
    """Groups of 4 rows of one prompt, of different lengths, so rows leave at different steps."""
    jobs = []
    for g, prompt in enumerate(prompts):
        for k in range(4):
            sampling = SamplingParams(
                temperature=0.0 if greedy else 1.0, max_tokens=6 + 5 * k + g, seed=100 * g + k
            )
            jobs.append((prompt, sampling))
    return jobs


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return id_model(3)


@pytest.mark.parametrize("greedy", [True, False])
async def test_engine_sharing_prompts_returns_the_same_tokens(model, greedy: bool) -> None:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, ID_VOCAB, (n,), generator=g).tolist() for n in (40, 23, 61, 9)]
    jobs = _group_jobs(prompts, greedy)
    jobs.append((prompts[1][:17], SamplingParams(temperature=0.0, max_tokens=20)))  # alone
    results = {}
    for share in (True, False):
        engine = TorchEngine(model, share_prompts=share, max_batch_size=12)  # rows wait, then join
        try:
            results[share] = await _generate_all(engine, jobs, stagger=0.01)
        finally:
            engine.close()
    for shared, copied in zip(results[True], results[False], strict=True):
        assert shared.token_ids == copied.token_ids
        assert shared.logprobs == pytest.approx(copied.logprobs, abs=1e-4)
    if not greedy:  # each sample of a group its own
        assert len({tuple(r.token_ids[:6]) for r in results[True][:4]}) > 1


async def test_a_groups_prompt_is_stored_once(model) -> None:
    prompt = list(range(1, 201))
    sampling = SamplingParams(temperature=1.0, max_tokens=500)
    held = {}
    for share in (True, False):
        engine = TorchEngine(model, share_prompts=share)
        try:
            await engine.pause()
            tasks = [
                asyncio.ensure_future(
                    engine.generate(prompt, sampling.model_copy(update={"seed": i}), f"s{i}")
                )
                for i in range(8)
            ]
            await asyncio.sleep(0.05)
            await engine.resume()
            for _ in range(500):  # until the 8 rows are decoding (a few steps in)
                await asyncio.sleep(0.01)
                batch = engine._scheduler._batch
                if len(batch.rows) == 8 and batch.mask.shape[1] > 2:
                    break
            await engine.pause()
            batch = engine._scheduler._batch
            assert len(batch.rows) == 8
            held[share] = (batch.cache_bytes, batch.shared)
            for task in tasks:
                task.cancel()
        finally:
            engine.close()
    bytes_shared, prompts = held[True]
    bytes_copied, none = held[False]
    assert none is None and prompts is not None
    config = model.config
    per_token = (
        2 * config.num_hidden_layers * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads) * 4
    )  # keys and values, float32
    assert prompts.nbytes == len(prompt) * per_token  # the prompt once, not once per row
    assert bytes_copied >= 8 * len(prompt) * per_token
    assert bytes_shared < 0.4 * bytes_copied  # own columns (with decode room) are the rest


async def test_smollm2_greedy_ids_unchanged_by_sharing(smollm2_folder) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder, torch_dtype=torch.float32)
    prompt = list(range(300, 420))
    jobs = [(prompt, SamplingParams(temperature=0.0, max_tokens=12 + 4 * k)) for k in range(4)]
    jobs += [(prompt[:50], SamplingParams(temperature=0.0, max_tokens=16))]
    results = {}
    for share in (True, False):
        engine = TorchEngine(model, share_prompts=share)
        try:
            results[share] = await _generate_all(engine, jobs, stagger=0.0)
        finally:
            engine.close()
    assert [r.token_ids for r in results[True]] == [r.token_ids for r in results[False]]


async def test_a_finished_rows_cache_serves_its_next_call(model) -> None:
    """A row of a shared prompt leaves its keys to the prefix cache (prompt and own tokens
    joined): the tool loop's next call reuses them and decodes what a fresh engine does."""
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, ID_VOCAB, (70,), generator=g).tolist()
    group = [SamplingParams(temperature=1.0, max_tokens=30, seed=k) for k in range(4)]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    answers = {}
    for name, options in (("shared", {"prefix_cache_mb": 64}),
                          ("fresh", {"prefix_cache_mb": 0, "share_prompts": False})):  # fmt: skip
        engine = TorchEngine(model, **options)
        try:
            rounds = []
            for _ in range(2):  # the second round finds the prompt in the prefix cache
                await engine.pause()  # the group is admitted together
                calls = [asyncio.ensure_future(engine.generate(prompt, s, f"g{k}"))
                         for k, s in enumerate(group)]  # fmt: skip
                await asyncio.sleep(0.05)
                await engine.resume()
                rounds.append(await asyncio.gather(*calls))
            first = rounds[0]
            follow = [prompt + r.token_ids + [5, 6, 7] for r in first]
            answers[name] = [[r.token_ids for r in results] for results in rounds], [
                (await engine.generate(context, greedy, f"next{k}")).token_ids
                for k, context in enumerate(follow)
            ]
            if name == "shared":
                # the prompt's 64 whole-block tokens found by the second round; 70 + 30 tokens
                # of each row, 96 in whole blocks, found again by its next call
                assert engine._scheduler.prefixes.hit_tokens >= 64 + 4 * 96
        finally:
            engine.close()
    assert answers["shared"] == answers["fresh"]


async def _admitted_together(
    engine: TorchEngine, jobs: list[tuple[list[int], SamplingParams]], name: str
) -> list[asyncio.Future[GenerateResult]]:
    await engine.pause()
    tasks = [asyncio.ensure_future(engine.generate(c, s, f"{name}{k}"))
             for k, (c, s) in enumerate(jobs)]  # fmt: skip
    await asyncio.sleep(0.05)
    await engine.resume()
    return tasks


@pytest.mark.parametrize("greedy", [True, False])
async def test_a_groups_next_calls_share_its_prompt(model, greedy: bool) -> None:
    """A tool loop's next calls of a group's rows, admitted together: each context is distinct,
    but their cached prefixes start with the group's prompt, which is stored once; each row
    keeps only what follows it, and decodes what an engine without sharing or cache does."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, ID_VOCAB, (n,), generator=g).tolist() for n in (70, 53)]
    first = [(p, SamplingParams(temperature=1.0, max_tokens=20 + 3 * k, seed=k))
             for p in prompts for k in range(4)]  # fmt: skip
    answers, seen = {}, {}
    for name, options in (("shared", {"prefix_cache_mb": 64}),
                          ("fresh", {"prefix_cache_mb": 0, "share_prompts": False})):  # fmt: skip
        engine = TorchEngine(model, **options)
        try:
            calls = await asyncio.gather(*await _admitted_together(engine, first, "f"))
            follow = [
                (prompt + r.token_ids + [5, 6, 7 + k], SamplingParams(
                    temperature=0.0 if greedy else 1.0, max_tokens=40, seed=50 + k))
                for k, ((prompt, _), r) in enumerate(zip(first, calls, strict=True))
            ]  # fmt: skip
            tasks = await _admitted_together(engine, follow, "n")
            for _ in range(500):  # a few steps in, look at the batch
                await asyncio.sleep(0.005)
                batch = engine._scheduler._batch
                if len(batch.rows) == 8 and batch.positions.min() > len(follow[0][0]) + 2:
                    break
            await engine.pause()
            batch = engine._scheduler._batch
            seen[name] = (batch.mask.shape[1], batch.shared)
            await engine.resume()
            answers[name] = [r.token_ids for r in calls], await asyncio.gather(*tasks)
        finally:
            engine.close()
    (calls, shared), (fresh_calls, copied) = answers["shared"], answers["fresh"]
    assert calls == fresh_calls
    for a, b in zip(shared, copied, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    (own_width, prompts), (copied_width, none) = seen["shared"], seen["fresh"]
    assert none is None and copied_width > 70
    assert prompts is not None and prompts.groups.tolist() == [0] * 4 + [1] * 4
    # each group's prompt, in whole blocks of 16 (64 and 48 tokens), stored once
    assert prompts.mask.sum(dim=1).tolist() == [64, 48]
    assert own_width < copied_width - 40  # the rows' own columns: their calls and tools only
