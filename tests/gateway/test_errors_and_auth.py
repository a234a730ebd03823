"""Bad requests get OpenAI-style errors; the bearer token is required; rewards and routing."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import AsyncOpenAI

import agentrl_sdk as sdk
from agentrl_sdk.gateway import Gateway, GatewayConfig

# The gateway fixture serves on the session loop (asyncio_default_fixture_loop_scope): the tests
# must run on it too, or its server task never runs.
pytestmark = pytest.mark.asyncio(loop_scope="session")
SMALL = sdk.RolloutConfig(
    sampling=sdk.SamplingParams(max_tokens=4, seed=0), chat=sdk.ChatConfig(max_context_tokens=64)
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def gateway(random_engine, qwen_tokenizer):
    async with Gateway(random_engine, qwen_tokenizer, rollout=SMALL) as gw:
        gw.open("r")
        yield gw


def _client(gw: Gateway, api_key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key or gw.api_key}"}
    return httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30)


async def _post(gw: Gateway, body: dict, path: str = "/rollouts/r/v1/chat/completions"):
    async with _client(gw) as client:
        return await client.post(path, json=body)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


async def test_missing_or_wrong_token_is_rejected(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        missing = await client.post("/rollouts/r/v1/chat/completions",
                                    json={"model": "agentrl", "messages": HELLO})
        health = await client.get("/health")
    assert _error(missing, 401)["code"] == "missing_api_key"
    assert health.status_code == 200  # liveness needs no token
    with pytest.raises(openai.AuthenticationError) as caught:
        await AsyncOpenAI(base_url=gateway.rollout_url("r"), api_key="wrong",
                          max_retries=0).chat.completions.create(model="agentrl", messages=HELLO)
    assert caught.value.code == "invalid_api_key"
    assert gateway.close("r").calls == []  # nothing reached the engine


async def test_unknown_model_is_a_404(gateway):
    with pytest.raises(openai.NotFoundError) as caught:
        await AsyncOpenAI(base_url=gateway.rollout_url("r"), api_key=gateway.api_key,
                          max_retries=0).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"content": "no role"}], "messages.0.role"),
        ([{"role": "wizard", "content": "x"}], "messages.0.role"),
        ([{"role": "user"}], "messages.0"),
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}], "messages.1"),
        ([{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}],
         "messages.0.tool_calls.0.function.arguments"),
        ([], "messages"),
    ],
    ids=["no-role", "unknown-role", "no-content", "tool-without-id", "bad-arguments", "empty"],
)
async def test_malformed_messages_are_a_400(gateway, messages, param):
    error = _error(await _post(gateway, {"model": "agentrl", "messages": messages}), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


async def test_too_long_context_is_a_400_and_marks_the_rollout(gateway):
    long = [{"role": "user", "content": "word " * 200}]
    with pytest.raises(openai.BadRequestError) as caught:
        await AsyncOpenAI(base_url=gateway.rollout_url("r"), api_key=gateway.api_key,
                          max_retries=0).chat.completions.create(model="agentrl", messages=long)
    assert caught.value.code == "context_length_exceeded"
    traj = gateway.close("r")
    assert traj.status == "context_exceeded" and "64 tokens" in traj.error


async def test_stop_strings_of_any_length_pass_through(gateway):
    body = {"model": "agentrl", "messages": HELLO, "max_tokens": 24}
    for stop, cut in (("two words", "two words"), (["<|im_end|>", "e"], "e")):
        ok = await _post(gateway, {**body, "stop": stop})
        assert ok.status_code == 200, ok.text
        (choice,) = ok.json()["choices"]
        assert cut not in (choice["message"]["content"] or "")
    assert _error(await _post(gateway, {**body, "stop": [""]}), 400)["param"] == "stop"


async def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(gateway, qwen_tokenizer):
    tool = {"type": "function", "function": {"name": "add", "description": "Add.",
                                             "parameters": {"type": "object", "properties": {}}}}
    body = {"model": "agentrl", "messages": HELLO, "max_tokens": 2, "tools": [tool]}
    ok = await _post(gateway, {**body, "tool_choice": "none"})
    assert ok.status_code == 200, ok.text
    (call,) = gateway.close("r").calls
    assert "<tools>" not in qwen_tokenizer.decode(call.prompt_ids)
    # With the tools rendered the prompt no longer fits the 64-token budget.
    named = {"type": "function", "function": {"name": "add"}}
    gateway.open("r2")
    too_long = await _post(gateway, {**body, "tool_choice": named},
                           "/rollouts/r2/v1/chat/completions")
    assert _error(too_long, 400)["code"] == "context_length_exceeded"


async def test_unknown_or_closed_rollout_and_missing_header(gateway):
    body = {"model": "agentrl", "messages": HELLO}
    assert _error(await _post(gateway, body, "/rollouts/nope/v1/chat/completions"),
                  404)["code"] == "rollout_not_found"
    assert _error(await _post(gateway, body, "/v1/chat/completions"),
                  400)["code"] == "rollout_id_missing"
    gateway.close("r")
    assert _error(await _post(gateway, body), 404)["code"] == "rollout_not_found"


async def test_header_routing_rewards_and_trajectory(gateway):
    async with _client(gateway) as client:
        reply = await client.post("/v1/chat/completions", headers={"X-Rollout-Id": "r"},
                                  json={"model": "agentrl", "messages": HELLO, "n": 2})
        await client.post("/rollouts/r/reward", json={"value": 0.5})
        await client.post("/rollouts/r/reward", json={"value": 0.25})
        await client.post("/rollouts/r/reward", json={"value": 1, "name": "format"})
        bad = await client.post("/rollouts/r/reward", json={"value": "NaN"})
        snapshot = (await client.get("/rollouts/r/trajectory")).json()
        closed = (await client.delete("/rollouts/r")).json()
    assert reply.status_code == 200
    choices = reply.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert _error(bad, 400)["param"] == "value"
    assert closed == snapshot
    traj = sdk.Trajectory.model_validate(closed)
    assert traj.rewards == {"reward": 0.75, "format": 1.0}
    assert len(traj.calls) == 2 and len(traj.segments) == 2  # n=2: one segment per choice
    assert reply.json()["usage"]["completion_tokens"] == sum(
        len(c.response_ids) for c in traj.calls
    )


async def test_auth_can_be_turned_off_and_rollouts_opened_over_http(random_engine, qwen_tokenizer):
    config = GatewayConfig(auth=False)
    async with Gateway(random_engine, qwen_tokenizer, config=config, rollout=SMALL) as gw:
        assert gw.api_key is None
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            opened = (await client.post("/rollouts")).json()
            models = (await client.get("/v1/models")).json()
        client = AsyncOpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0)
        await client.chat.completions.create(model="agentrl", messages=HELLO)
        assert len(gw.close(opened["rollout_id"]).calls) == 1
    assert [m["id"] for m in models["data"]] == ["agentrl"]


async def test_agent_rollouts_record_engine_events_for_traces(random_engine, qwen_tokenizer):
    async def agent(endpoint, row):
        client = endpoint.client(max_retries=0, timeout=30)
        for _ in range(2):
            await client.chat.completions.create(model=endpoint.model, messages=row["messages"])
        raise RuntimeError("the agent gave up")

    row = {"id": "row-1", "messages": HELLO}
    traced, second = await sdk.arollout(agent, row, random_engine, tokenizer=qwen_tokenizer,
                                       n=2, config=SMALL, record_events=True)
    assert traced.status == "graph_error" and "gave up" in traced.error
    assert (traced.row_id, traced.sample_index, second.sample_index) == ("row-1", 0, 1)
    assert len(traced.calls) == 2  # the calls made before the agent raised are kept
    # Each call is an LLM event holding its engine event, as in a graph's rollout.
    assert [(e.kind, e.call_index) for e in traced.events] == [
        ("llm", 0), ("engine", 0), ("llm", 1), ("engine", 1)
    ]
    llm, engine = traced.events[:2]
    assert engine.parent_id == llm.id and llm.start_ns <= engine.start_ns <= engine.end_ns
    # The MLflow trace builder turns it into spans carrying the call's token ids.
    from agentrl_sdk.tracing.traces import build_trace

    _, spans = build_trace(traced, experiment_id="0", step=0, tokenizer=qwen_tokenizer)
    names = [span.name for span in spans]
    assert names[0].startswith("rollout row-1#0") and names.count("llm · agent · turn 0") == 1
    llm_span = spans[names.index("llm · agent · turn 0")]
    assert llm_span.attributes["agentrl.response_ids"] == traced.calls[0].response_ids
