"""`PackedTensors`: state dicts through Ray's object store as arrays, exact and tie-preserving."""

from __future__ import annotations

import pickle

import torch

from agentrl_sdk.weights.tensor_transport import PackedTensors


def _state() -> dict[str, torch.Tensor]:
    embed = torch.randn(7, 3)
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,  # tied: one tensor under two names
        "norm.weight": torch.randn(3, dtype=torch.bfloat16),
        "steps": torch.arange(4),
    }


def test_round_trip_is_bit_exact_keeps_dtypes_and_ties():
    state = _state()
    back = pickle.loads(pickle.dumps(PackedTensors.pack(state), protocol=5)).unpack()
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype
        assert torch.equal(back[name], tensor)
    assert back["embed.weight"] is back["lm_head.weight"]
    assert back["embed.weight"] is not back["norm.weight"]


def test_tied_arrays_count_once():
    state = _state()
    packed = PackedTensors.pack(state)
    assert packed.nbytes == 7 * 3 * 4 + 3 * 2 + 4 * 8


def test_non_contiguous_tensors_travel_by_value():
    base = torch.arange(12.0).reshape(3, 4)
    back = PackedTensors.pack({"t": base.t()}).unpack()
    assert torch.equal(back["t"], base.t())
