"""The torch engine's decode path: grouped attention against SDPA, and a KV cache that appends
decode steps in place yet holds exactly what concatenation would."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.torch.decode_attention import NAME, grouped_decode_attention
from agentrl_sdk.engines.torch.kv_cache import (
    DECODE_ROOM,
    RoomyLayer,
    append_rows,
    fill_order,
    fits,
    keep_rows,
    room_of,
)
from tests.engines._tiny import id_model


def _reference(query, key, value, mask):  # float64 SDPA over repeated key/value heads
    groups = query.shape[1] // key.shape[1]
    key, value = (t.double().repeat_interleave(groups, dim=1) for t in (key, value))
    mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    return F.scaled_dot_product_attention(query.double(), key, value, attn_mask=mask)


@pytest.mark.parametrize("length", [1, 3])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_grouped_attention_equals_sdpa(length: int, mask_kind: str) -> None:
    torch.manual_seed(0)
    batch, heads, kv_heads, keys, dim = 4, 6, 2, 11, 8
    query = torch.randn(batch, heads, length, dim)
    key, value = torch.randn(2, batch, kv_heads, keys, dim)
    causal = torch.ones(length, keys, dtype=torch.bool).tril(keys - length)
    allowed = causal.expand(batch, 1, length, keys).clone()
    if mask_kind != "none":  # no mask: transformers leaves the causal rule to the attention
        allowed[0, :, :, :5] = False  # a left-padded row
        allowed[2, :, :, :2] = False
        allowed[3, :, :, : keys - length + 1] = False  # a padding query: sees nothing
    mask = {"none": None, "bool": allowed,
            "additive": torch.zeros(allowed.shape).masked_fill(~allowed, -1e30)}[mask_kind]
    out = grouped_decode_attention(query, key, value, mask, dim**-0.5)  # (B, Q, H, D)
    assert bool(torch.isfinite(out).all())
    if mask_kind != "none":  # SDPA's answer for a query that sees nothing is not a contract
        out, query, key, value, allowed = (t[:3] for t in (out, query, key, value, allowed))
        batch = 3
    expected = _reference(query, key, value, allowed).transpose(1, 2)
    assert out.shape == (batch, length, heads, dim)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_decode_steps_append_in_place_and_equal_concatenation() -> None:
    torch.manual_seed(1)
    layer = RoomyLayer()
    prompt = torch.randn(3, 2, 5, 4)
    keys, _ = layer.update(prompt, -prompt)
    assert keys.untyped_storage().nbytes() == keys.numel() * keys.element_size()  # no room
    expected = prompt
    buffers = set()
    for _ in range(DECODE_ROOM + 2):  # runs out of room once
        step = torch.randn(3, 2, 1, 4)
        keys, values = layer.update(step, -step)
        expected = torch.cat([expected, step], dim=-2)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
        buffers.add(keys.data_ptr())
    assert len(buffers) == 2  # one copy to make room, one when it ran out
    # The running batch replaces the tensors when rows finish: appends go on from those.
    layer.keys, layer.values = keys[[0, 2]], values[[0, 2]]
    step = torch.randn(2, 2, 1, 4)
    keys, values = layer.update(step, -step)
    assert torch.equal(keys, torch.cat([expected[[0, 2]], step], dim=-2))
    assert torch.equal(values, -torch.cat([expected[[0, 2]], step], dim=-2))


def test_fill_order_moves_only_the_rows_below_the_survivors() -> None:
    assert fill_order([0, 2, 3, 5]) == [0, 5, 2, 3]  # row 5 takes the place row 1 left
    assert fill_order([1, 2, 3]) == [3, 1, 2]
    assert fill_order([0, 1]) == [0, 1]
    assert fill_order([4]) == [4]


def test_rows_leave_and_join_inside_the_buffer() -> None:
    torch.manual_seed(2)
    layer = RoomyLayer()
    prompt = torch.randn(4, 2, 5, 3)
    layer.update(prompt, -prompt)
    step = torch.randn(4, 2, 1, 3)
    keys, _ = layer.update(step, -step)
    expected = torch.cat([prompt, step], dim=-2)  # (4, 2, 6, 3)
    buffer = room_of(keys).data_ptr()

    with torch.inference_mode():  # as the engine thread's buffers are
        order = fill_order([0, 2, 3])  # row 1 finished: row 3 moves into its place
        kept = keep_rows(keys, order)
        assert torch.equal(kept, expected[order]) and kept.data_ptr() == buffer
        # A wider fresh row joins in the freed row; the kept rows gain a gap of 2 columns.
        fresh = torch.randn(1, 2, 8, 3)
        joined = append_rows(kept, fresh)
    assert joined.data_ptr() == buffer
    assert joined.shape == (4, 2, 8, 3)
    assert torch.equal(joined[:3, :, :6], expected[order]) and torch.equal(joined[3], fresh[0])
    assert torch.isfinite(room_of(joined)).all()
    # A narrower one is left-padded with zeros; no spare row left: no fit (the batch concatenates).
    with torch.inference_mode():
        assert not fits(joined, torch.randn(1, 2, 3, 3))
        with pytest.raises(ValueError, match="no room"):
            append_rows(joined, torch.randn(1, 2, 3, 3))
        narrower = append_rows(keep_rows(joined, [0, 1, 2]), torch.ones(1, 2, 3, 3))
    assert torch.equal(narrower[3, :, :5], torch.zeros(2, 5, 3))
    assert torch.equal(narrower[3, :, 5:], torch.ones(2, 3, 3))


async def test_the_engine_decodes_with_grouped_attention() -> None:
    model = id_model()  # SDPA, as transformers loads it
    engine = TorchEngine(model)
    try:
        assert engine.model.config._attn_implementation == NAME
    finally:
        engine.close()
