"""Packed bf16 linear layers: the same products as the plain weights, packed again when the
weights change, never used where autograd runs, and handed back when the engine closes."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.torch.packed_linears import PackedLinears
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict
from tests.engines._tiny import ID_VOCAB, id_model

pytestmark = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU's oneDNN does not compute bf16: nothing is packed",
)


def _bf16_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to bf16 rounding: at most one unit in the last place of the larger magnitude."""
    tolerance = expected.abs().float() * 2**-7 + 1e-6
    assert bool(((actual.float() - expected.float()).abs() <= tolerance).all())


def _layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 192, bias=False), nn.Linear(192, 48)).bfloat16()


def test_packed_layers_compute_the_plain_products_and_follow_weight_changes() -> None:
    layers = _layers()
    x = torch.randn(5, 3, 64, dtype=torch.bfloat16)
    packed = PackedLinears(layers)
    assert len(packed) == 2 and all("forward" in m.__dict__ for m in layers)

    def plain(inputs: torch.Tensor) -> torch.Tensor:
        for m in layers:
            inputs = F.linear(inputs, m.weight, m.bias)
        return inputs

    with torch.inference_mode():
        _bf16_close(layers(x), plain(x))
        with torch.no_grad():  # written in place, as load_state_dict does
            layers[0].weight.copy_(layers[0].weight * -2)
        _bf16_close(layers(x), plain(x))
    layers[1].weight = nn.Parameter(torch.randn(48, 192, dtype=torch.bfloat16))  # replaced
    with torch.inference_mode():
        _bf16_close(layers(x), plain(x))

    # Where autograd runs, the plain product: the packed one has no backward.
    x.requires_grad_()
    layers(x).square().sum().backward()
    grad = x.grad.clone()
    x.grad = None
    plain(x).square().sum().backward()
    torch.testing.assert_close(grad, x.grad)

    packed.restore()
    assert all("forward" not in m.__dict__ for m in layers)


def test_float32_layers_are_left_alone() -> None:
    layers = _layers().float()
    assert len(PackedLinears(layers)) == 0
    assert all("forward" not in m.__dict__ for m in layers)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, ID_VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17, 30) * 3]


def _logprobs_of(model: nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return logits.float().log_softmax(-1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def _serve(engine: TorchEngine, prompts: list[list[int]], tag: str) -> list:
    sampling = SamplingParams(temperature=0.0, max_tokens=8)

    async def run() -> list:
        return await asyncio.gather(
            *(engine.generate(p, sampling, f"{tag}{i}") for i, p in enumerate(prompts))
        )

    return asyncio.run(run())


def test_a_bf16_engine_serves_packed_weights_and_follows_weight_updates() -> None:
    model = id_model(0).bfloat16()
    new_model = id_model(1).bfloat16()
    prompts = _prompts()
    engine = TorchEngine(copy.deepcopy(model), eos_token_ids=())
    served = engine.model
    try:
        assert len(engine._packed) == 2 * 7 + 1  # q, k, v, o, gate, up, down a layer; the head
        for version, reference in ((0, model), (1, new_model)):
            if version:  # written into the served parameters in place: packed again
                asyncio.run(engine.load_weights(StateDict(new_model.state_dict()), version))
            for prompt, result in zip(prompts, _serve(engine, prompts, f"v{version}-"),
                                      strict=True):  # fmt: skip
                expected = _logprobs_of(reference, prompt, result.token_ids)
                torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=0.05,
                                           rtol=0)  # fmt: skip
    finally:
        engine.close()
    assert not any("forward" in m.__dict__ for m in served.modules())  # handed back
