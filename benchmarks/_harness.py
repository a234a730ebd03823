"""What the benchmarks share: the tiny id-only model, prompts, timing runners, engine wrappers.

One copy, so every benchmark measures by the same rule: one model recipe
(``agentrl_sdk.models.build_tiny_model``), the same prompts and sampling settings on every side
of a comparison, and one way of telling the engine's time from what wraps it.
"""

from __future__ import annotations

import asyncio
import time

import torch
from transformers import GenerationConfig, PreTrainedModel

from agentrl_sdk.engines import Engine
from agentrl_sdk.models import build_small_tokenizer, build_tiny_model
from agentrl_sdk.types import GenerateResult, SamplingParams

TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95
PROMPT_VOCAB = 1024  # prompt ids are drawn below this


def ids_only_model(
    vocab: int, hidden: int, layers: int, heads: int, kv_heads: int
) -> PreTrainedModel:
    """A random float32 Qwen2 (seed 0, untied, MLP ``3 * hidden``) for token ids only, with no EOS.

    ``build_tiny_model`` sizes the embedding from a tokenizer: a small BPE 64 short of ``vocab``
    (a multiple of 64), whose added tokens round it back up to ``vocab``. Its EOS is dropped so
    that every system decodes exactly the tokens asked for: equal work on each side.
    """
    tokenizer = build_small_tokenizer(vocab_size=vocab - 64)
    model = build_tiny_model(
        tokenizer, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=3 * hidden, max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    assert model.config.vocab_size == vocab, (model.config.vocab_size, vocab)
    model.config.eos_token_id = None
    model.generation_config = GenerationConfig(do_sample=False)
    return model


def make_prompts(n: int) -> list[list[int]]:
    """``n`` seeded prompts of 8 to 64 random ids: the same requests for every system."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 65, (n,), generator=g).tolist()
    return [torch.randint(0, PROMPT_VOCAB, (k,), generator=g).tolist() for k in lengths]


def run_hf(model: PreTrainedModel, prompts: list[list[int]], new_tokens: int) -> tuple[int, float]:
    """Baseline: HF ``generate`` on one request at a time. Returns (tokens, seconds)."""
    total = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), do_sample=True, temperature=TEMPERATURE, top_k=TOP_K,
                top_p=TOP_P, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
            )  # fmt: skip
            total += out.shape[1] - len(prompt)
    return total, time.perf_counter() - start


async def run_engine(
    engine: Engine, prompts: list[list[int]], new_tokens: int
) -> tuple[int, float]:
    """All requests at once, as an engine that batches wants them. Returns (tokens, seconds)."""
    sampling = SamplingParams(
        temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P, max_tokens=new_tokens
    )
    start = time.perf_counter()
    results = await asyncio.gather(
        *(engine.generate(p, sampling, f"bench-{i}") for i, p in enumerate(prompts))
    )
    return sum(len(r.token_ids) for r in results), time.perf_counter() - start


class TimedEngine:
    """Delegates to the real engine, adds up time inside ``generate``, keeps the answers.

    The time outside ``generate`` is then the cost of what wraps the engine, and the answers
    let a :class:`ReplayEngine` repeat the same conversations with no engine time at all.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seconds = 0.0
        self.calls = 0
        self.answers: dict[tuple[int, ...], GenerateResult] = {}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       *, session_id: str | None = None) -> GenerateResult:  # fmt: skip
        start = time.perf_counter()
        try:
            result = await self.engine.generate(prompt_ids, sampling, request_id)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
        self.answers[tuple(prompt_ids)] = result
        return result


class ReplayEngine:
    """Answers at once with what the real engine answered to the very same prompt: the cost of
    the wrapping code as it would be next to a GPU or remote engine."""

    def __init__(self, answers: dict[tuple[int, ...], GenerateResult]) -> None:
        self.answers = answers
        self.seconds = 0.0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       *, session_id: str | None = None) -> GenerateResult:  # fmt: skip
        return self.answers[tuple(prompt_ids)]  # KeyError if the replay diverged
