"""Call arguments and constructor fields of TokenChatModel are honoured or refused, never ignored."""

from __future__ import annotations

import asyncio

import pydantic
import pytest

from agentrl_sdk import EngineError, TokenChatModel


def test_call_sampling_arguments_override_the_instance(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["a", "b", "c"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer, temperature=0.7, top_k=5)
    model.bind(max_tokens=3, top_p=0.5).invoke("hi")
    model.invoke("hi", temperature=0, seed=11)
    model.invoke("hi")
    bound, called, plain = (sampling for _, sampling in engine.requests)
    assert (bound.max_tokens, bound.top_p, bound.temperature, bound.top_k) == (3, 0.5, 0.7, 5)
    assert called.temperature == 0 and called.seed is not None and called.top_k == 5
    assert plain.temperature == 0.7 and plain.max_tokens != 3 and plain.seed is None


def test_unknown_call_arguments_are_refused_by_name(qwen_tokenizer, scripted):
    model = TokenChatModel(engine=scripted(qwen_tokenizer, ["a"]), tokenizer=qwen_tokenizer)
    with pytest.raises(TypeError, match="frequency_penalty"):
        model.invoke("hi", frequency_penalty=1.0)


def test_unknown_constructor_fields_are_refused_by_name():
    with pytest.raises(pydantic.ValidationError, match="organisation"):
        TokenChatModel(organisation="acme")
    # LangChain's standard parameters are taken (the engine is local: the key is unused).
    assert TokenChatModel(api_key="sk-none").api_key.get_secret_value() == "sk-none"


def test_max_retries_sends_a_failed_call_again(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["ok"])
    answer = engine.generate
    failures = []

    async def flaky(*args, **kwargs):
        if len(failures) < 2:
            failures.append(1)
            raise EngineError("replica lost")
        return await answer(*args, **kwargs)

    engine.generate = flaky
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer, max_retries=1)
    with pytest.raises(EngineError, match="replica lost"):
        model.invoke("hi")
    failures.clear()
    assert model.model_copy(update={"max_retries": 2}).invoke("hi").content == "ok"


def test_streaming_flag_gives_the_same_reply(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["one"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer, streaming=True)
    assert model.invoke("hi").content == "one"


def test_constructor_stop_is_the_default_stop(qwen_tokenizer, scripted):
    engine = scripted(qwen_tokenizer, ["a", "b"])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer, stop=["<|endoftext|>"])
    model.invoke("hi")
    model.invoke("hi", stop=[])
    assert engine.requests[0][1].stop_token_ids == (151643,)
    assert engine.requests[1][1].stop_token_ids == ()


def test_timeout_bounds_each_engine_call(qwen_tokenizer):
    class Silent:
        policy_version = 0

        async def generate(self, *args, **kwargs):
            await asyncio.sleep(30)

    model = TokenChatModel(engine=Silent(), tokenizer=qwen_tokenizer, timeout=0.05)
    with pytest.raises(EngineError, match="within 0.05s"):
        model.invoke("hi")
