"""Engines users write: the README's own engine serves rollouts, one written against the first
release's three-argument ``generate`` still does, and an object that cannot serve is refused
before any rollout with the signature to write."""

from __future__ import annotations

import pytest
from langgraph.graph import END, START, MessagesState, StateGraph

import agentrl_sdk as sdk
from agentrl_sdk import RolloutConfig
from agentrl_sdk.models import build_tiny_model
from agentrl_sdk.types import SamplingParams
from examples.own_engine.engine import HFGenerateEngine

ROW = {"id": "r0", "messages": [{"role": "user", "content": "Draft a line, then improve it."}]}


async def _draft(state, config):
    return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}


async def _revise(state, config):
    prompt = [*state["messages"], {"role": "user", "content": "Improve it."}]
    return {"messages": [await sdk.chat_model(config).ainvoke(prompt)]}


def _two_call_graph():
    builder = StateGraph(MessagesState)
    builder.add_node("draft", _draft)
    builder.add_node("revise", _revise)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "revise")
    builder.add_edge("revise", END)
    return builder.compile()


class Recording(HFGenerateEngine):
    """The README's engine, keeping what it answered."""

    answers: list

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        result = await super().generate(prompt_ids, sampling, request_id)
        self.answers.append((list(prompt_ids), result, session_id))
        return result


class FirstRelease(Recording):
    """Written against the first release's protocol: no ``session_id``."""

    async def generate(self, prompt_ids, sampling, request_id):
        return await super().generate(prompt_ids, sampling, request_id)


@pytest.fixture(scope="module")
def tiny(qwen_tokenizer):
    return build_tiny_model(qwen_tokenizer, hidden_size=64, num_layers=2)


@pytest.mark.parametrize("engine_class", [Recording, FirstRelease])
async def test_a_users_engine_serves_a_two_call_rollout_token_exact(
    qwen_tokenizer, tiny, engine_class
):
    engine = engine_class(tiny, [qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")])
    engine.answers = []
    config = RolloutConfig(n=2, sampling=SamplingParams(max_tokens=8, seed=3))

    trajectories = await sdk.arollout(_two_call_graph(), ROW, engine, tokenizer=qwen_tokenizer,
                                      config=config)  # fmt: skip

    assert [t.status for t in trajectories] == ["ok", "ok"], trajectories[0].error
    calls = [c for t in trajectories for c in t.calls]
    assert sorted(c.node for c in calls) == ["draft", "draft", "revise", "revise"]
    # What was recorded is exactly what the engine was asked and returned.
    answered = sorted((p, r.token_ids, r.logprobs) for p, r, _ in engine.answers)
    assert answered == sorted((c.prompt_ids, c.response_ids, c.response_logprobs) for c in calls)
    # The old engine is called without a session; the new one gets its rollout's.
    sessions = {s for _, _, s in engine.answers}
    assert sessions == ({None} if engine_class is FirstRelease else {"r0:0", "r0:1"})


class NotAnEngine:
    def complete(self, text: str) -> str:
        return text


class TwoArguments:
    policy_version = 0

    async def generate(self, prompt_ids, sampling):
        raise AssertionError("never called")


@pytest.mark.parametrize(("engine", "what"), [
    (NotAnEngine(), "NotAnEngine is not an engine: it has no generate()"),
    (TwoArguments(), "TwoArguments.generate takes 2 positional arguments"),
])
async def test_an_object_that_cannot_serve_is_refused_before_any_rollout(qwen_tokenizer, engine,
                                                                         what):
    with pytest.raises(TypeError) as refused:
        await sdk.arollout(_two_call_graph(), ROW, engine, tokenizer=qwen_tokenizer)
    assert str(refused.value).startswith(what)
    assert "async def generate(self, prompt_ids: list[int], sampling: SamplingParams, " \
        "request_id: str, *, session_id: str | None = None)" in str(refused.value)
