"""Stop strings of any length: the reply's text is cut at the stop, the ledger keeps every id."""

from __future__ import annotations

import pytest

from agentrl_sdk import TokenChatModel
from agentrl_sdk.chat import RolloutRecorder, current_recorder
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import build_tiny_model
from agentrl_sdk.types import SamplingParams


@pytest.fixture(scope="module")
def torch_engine(qwen_tokenizer):
    engine = TorchEngine(build_tiny_model(qwen_tokenizer, hidden_size=32, num_layers=1),
                         tokenizer=qwen_tokenizer)
    yield engine
    engine.close()


async def test_reply_is_cut_at_the_first_stop_string(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["Hello, how are you today?"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer)
    reply = await model.ainvoke("hi", stop=[" you", "how are"])
    assert reply.content == "Hello,"
    assert engine.requests[0][1].stop == (" you", "how are")


async def _call(model, engine, **kwargs):
    """One call in a fresh recorder; the same rollout id gives the same seed every time."""
    recorder = RolloutRecorder(engine, model._chat_template(), rollout_id="r")
    token = current_recorder.set(recorder)
    try:
        reply = await model.ainvoke("hi", **kwargs)
    finally:
        current_recorder.reset(token)
    (call,) = recorder.ledger.calls
    return reply, call, recorder.ledger.segments[0]


async def test_torch_engine_stops_on_a_multi_token_string(qwen_tokenizer, torch_engine):
    model = TokenChatModel(engine=torch_engine, tokenizer=qwen_tokenizer, seed=7, max_tokens=16)
    _, free, _ = await _call(model, torch_engine)
    # A stop several tokens long, from the middle of what the model says unprompted.
    decode = qwen_tokenizer.decode
    stop = decode(free.response_ids[:6])[len(decode(free.response_ids[:2])):]
    assert len(qwen_tokenizer.encode(stop, add_special_tokens=False)) > 1

    reply, call, segment = await _call(model, torch_engine, stop=[stop])
    text = decode(free.response_ids)
    assert reply.content == text[: text.index(stop)].strip()
    assert reply.response_metadata["finish_reason"] == "stop"
    assert call.response_ids == free.response_ids[: len(call.response_ids)]
    assert stop in decode(call.response_ids) and stop not in decode(call.response_ids[:-1])
    assert segment.response_ids == call.response_ids  # kept as sampled, all mask 1
    assert segment.response_mask == [1] * len(call.response_ids)


async def test_engine_stop_token_ids_keep_working(qwen_tokenizer, torch_engine):
    prompt = qwen_tokenizer.encode("hello", add_special_tokens=False)
    free = await torch_engine.generate(prompt, SamplingParams(temperature=0, max_tokens=8), "a")
    stop_id = free.token_ids[2]
    first = free.token_ids.index(stop_id)
    out = await torch_engine.generate(
        prompt, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(stop_id,)), "b")
    assert out.token_ids == free.token_ids[: first + 1] and out.finish_reason == "stop"
