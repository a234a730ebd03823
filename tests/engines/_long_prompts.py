"""Seeded requests whose prompts exceed one engine step's token budget, for both vLLM engines."""

from __future__ import annotations

import asyncio

import torch

from agentrl_sdk.types import SamplingParams


async def assert_seeded_long_prompts_served(engine) -> None:
    """24 seeded requests of 150 prompt tokens at once: more than one step's token budget
    (2,048), so vLLM would split a prefill across steps and rewind the request's seeded
    generator, which CPU generators cannot (the engine died: 'CPU Generator does not use
    offset'). Each is served, and the same requests again give the same tokens."""
    g = torch.Generator().manual_seed(5)
    long = [torch.randint(1, 1000, (150,), generator=g).tolist() for _ in range(24)]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=11)

    async def batch():
        return await asyncio.gather(*(engine.generate(p, params, f"long-{i}")
                                      for i, p in enumerate(long)))  # fmt: skip

    first, again = await batch(), await batch()
    assert all(len(r.token_ids) == 8 for r in first)
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
