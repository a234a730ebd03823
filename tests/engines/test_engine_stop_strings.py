"""Stop strings end a request at the token that completes one, whatever tokens spell it."""

from __future__ import annotations

import pytest

from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.engines.stop_strings import StopStrings
from agentrl_sdk.engines.vllm.resumable import PartialOutput
from agentrl_sdk.models import build_small_tokenizer
from agentrl_sdk.types import SamplingParams
from tests.engines._tiny import ID_VOCAB, id_model, tiny_model_dir

PROMPT = [5, 17, 42, 99, 3]


@pytest.fixture(scope="module")
def tokenizer():
    return build_small_tokenizer(vocab_size=ID_VOCAB - 64)


@pytest.fixture(scope="module")
def engine(tokenizer):
    served = TorchEngine(id_model(0), tokenizer=tokenizer)
    yield served
    served.close()


def _first_completing(tokenizer, ids: list[int], stop: str) -> int:
    return next(n for n in range(1, len(ids) + 1)
                if stop in tokenizer.decode(ids[:n], skip_special_tokens=False))


def _multi_token_stop(tokenizer, ids: list[int]) -> str:
    """A stop string spelled by the 2nd..4th generated tokens (so several tokens)."""
    text = tokenizer.decode(ids[:4], skip_special_tokens=False)
    return text[len(tokenizer.decode(ids[:1], skip_special_tokens=False)):]


async def test_torch_engine_stops_after_the_token_completing_a_stop_string(engine, tokenizer):
    free = await engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24), "free")
    stop = _multi_token_stop(tokenizer, free.token_ids)
    assert len(tokenizer.encode(stop, add_special_tokens=False)) > 1
    expected = _first_completing(tokenizer, free.token_ids, stop)

    out = await engine.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=24, stop=(stop,)), "stopped")
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[:expected]
    assert out.logprobs == pytest.approx(free.logprobs[:expected])


async def test_a_stop_string_never_generated_does_not_stop(engine):
    out = await engine.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=6, stop=("\u2603never",)), "r")
    assert out.finish_reason == "length" and len(out.token_ids) == 6


async def test_torch_engine_without_tokenizer_refuses_stop_strings():
    bare = TorchEngine(id_model(0))
    try:
        with pytest.raises(ValueError, match="no tokenizer"):
            await bare.generate(PROMPT, SamplingParams(stop=("x",)), "r")
    finally:
        bare.close()


async def test_from_pretrained_reads_the_saved_tokenizer():
    served = TorchEngine.from_pretrained(tiny_model_dir())
    try:
        out = await served.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=8,
                                                              stop=("\u2603never",)), "r")
    finally:
        served.close()
    assert len(out.token_ids) >= 1


def test_multibyte_stop_found_across_byte_tokens(tokenizer):
    ids = tokenizer.encode("ab\u00e9\u4e2dz", add_special_tokens=False)
    stops = StopStrings(tokenizer, ["\u4e2d"])
    hits = [n for n in range(1, len(ids) + 1) if stops.hit(ids[:n])]
    assert hits and tokenizer.decode(ids[: hits[0]]).endswith("\u4e2d")
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(tokenizer, [""])


def test_partial_output_cuts_a_streamed_delta_at_the_stop(tokenizer):
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    partial = PartialOutput([1], SamplingParams(stop=(" three",)),
                            stop_strings=StopStrings(tokenizer, [" three"]))
    partial.extend(ids[:1], [0.0], 0)
    assert partial.finish_reason is None
    partial.extend(ids[1:], [-1.0] * (len(ids) - 1), 0)
    keep = _first_completing(tokenizer, ids, " three")
    assert partial.finish_reason == "stop"
    assert partial.token_ids == ids[:keep] and len(partial.logprobs) == len(partial.versions) == keep
