"""The running batch's sampling noise: Exp(1), per-row seeded, independent of batch position."""

from __future__ import annotations

import math

import torch

from agentrl_sdk.engines.torch.running_batch import RunningBatch, SequenceState
from agentrl_sdk.types import SamplingParams


def _row(seed: int, temperature: float = 1.0) -> SequenceState:
    generator = torch.Generator()
    generator.manual_seed(seed)
    sampling = SamplingParams(temperature=temperature, max_tokens=4, seed=seed)
    return SequenceState([1], sampling, frozenset(), generator)


def _batch(rows: list[SequenceState]) -> RunningBatch:
    none = torch.zeros(len(rows), dtype=torch.long)
    return RunningBatch(rows, None, none[:, None], none, none)


def test_noise_is_standard_exponential() -> None:
    noise = _batch([_row(s) for s in range(4)]).noise(50_000).flatten()  # 200k draws
    assert bool((noise > 0).all()) and bool(torch.isfinite(noise).all())
    assert abs(noise.mean().item() - 1.0) < 0.01  # sd of the mean: 1/sqrt(2e5) = 0.0022
    assert abs(noise.var().item() - 1.0) < 0.03
    for x in (0.1, 1.0, 3.0):  # the survival function P(E > x) = exp(-x)
        assert abs((noise > x).float().mean().item() - math.exp(-x)) < 0.005


def test_noise_depends_on_the_row_seed_not_its_position() -> None:
    alone = _batch([_row(7)]).noise(1000)
    mixed = _batch([_row(3), _row(0, temperature=0.0), _row(7)]).noise(1000)
    assert torch.equal(mixed[2], alone[0])
    assert torch.equal(mixed[1], torch.ones(1000))  # greedy rows: unused ones
    assert not torch.equal(mixed[0], mixed[2])
