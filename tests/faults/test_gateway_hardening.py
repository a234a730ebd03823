"""The gateway under misuse: unknown ids, too many or abandoned rollouts, huge bodies, and an
open bind without auth."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import agentrl_sdk as sdk
from agentrl_sdk.cli import app
from agentrl_sdk.gateway import (
    ExpiredRolloutError,
    Gateway,
    GatewayConfig,
    SessionRegistry,
    TooManyRolloutsError,
    UnknownRolloutError,
)

SMALL = sdk.RolloutConfig(
    sampling=sdk.SamplingParams(max_tokens=4, seed=0), chat=sdk.ChatConfig(max_context_tokens=64)
)
CHAT = {"model": "agentrl", "messages": [{"role": "user", "content": "hello"}]}


def _gateway(scripted, tokenizer, replies: int = 0, **config) -> Gateway:
    engine = scripted(tokenizer, ["hi"] * replies)
    return Gateway(engine, tokenizer, rollout=SMALL,
                   config=GatewayConfig(open_on_first_call=True, **config))


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=gw.url, timeout=30,
                             headers={"Authorization": f"Bearer {gw.api_key}"})


def _code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


async def test_reading_rewarding_or_closing_an_unknown_rollout_is_a_404_and_opens_nothing(
    scripted, qwen_tokenizer
):
    async with _gateway(scripted, qwen_tokenizer) as gw, _client(gw) as client:
        read = await client.get("/rollouts/ghost/trajectory")
        reward = await client.post("/rollouts/ghost/reward", json={"value": 1.0})
        closed = await client.delete("/rollouts/ghost")
        health = (await client.get("/health")).json()

    assert _code(read, 404) == _code(reward, 404) == _code(closed, 404) == "rollout_not_found"
    assert len(gw.registry) == 0 and health["rollouts"] == 0
    assert health["client_rollouts_opened"] == 0


async def test_client_rollouts_are_capped_then_expire_and_are_counted(scripted, qwen_tokenizer):
    config = {"max_client_rollouts": 2, "client_rollout_ttl_s": 1.5}
    async with _gateway(scripted, qwen_tokenizer, replies=3, **config) as gw, \
            _client(gw) as client:
        first = [await client.post(f"/rollouts/r{i}/v1/chat/completions", json=CHAT)
                 for i in (1, 2)]
        refused = await client.post("/rollouts/r3/v1/chat/completions", json=CHAT)
        over_http = await client.post("/rollouts")
        gw.open("pipeline-owned")  # the pipeline's own rollouts are not capped
        full = (await client.get("/health")).json()
        await asyncio.sleep(1.6)
        after = (await client.get("/health")).json()
        expired = await client.get("/rollouts/r1/trajectory")
        reopened = await client.post("/rollouts/r3/v1/chat/completions", json=CHAT)

    assert [r.status_code for r in first] == [200, 200]
    assert _code(refused, 429) == _code(over_http, 429) == "too_many_rollouts"
    assert "max_client_rollouts" in refused.json()["error"]["message"]
    assert (full["rollouts"], full["client_rollouts"], full["client_rollouts_refused"]) == (3, 2, 2)
    assert (after["rollouts"], after["client_rollouts"], after["client_rollouts_expired"]) == (
        1, 0, 2)
    assert _code(expired, 404) == "rollout_expired"
    assert reopened.status_code == 200 and gw.stats.client_rollouts_opened == 3
    assert "pipeline-owned" in gw.registry  # never expires: its owner closes it


def test_expiry_counts_from_the_last_request_not_from_the_open():
    now = [0.0]
    registry = SessionRegistry(lambda rid: object(), open_on_first_call=True, max_client=8,
                               client_ttl_s=10.0, clock=lambda: now[0])
    registry.get_or_open("busy")
    registry.get_or_open("idle")
    for t in (6.0, 12.0, 18.0):
        now[0] = t
        registry.get("busy")

    assert "busy" in registry and "idle" not in registry
    with pytest.raises(ExpiredRolloutError):
        registry.get_or_open("idle")  # not silently reopened with its first calls lost
    with pytest.raises(UnknownRolloutError):
        registry.get("never-seen")
    assert registry.stats.client_rollouts_expired == 1
    registry.open("mine")  # in-process opens are neither capped nor expired
    now[0] = 1e6
    assert registry.expire() == 1 and list(registry._sessions) == ["mine"]


def test_the_cap_counts_only_client_rollouts():
    registry = SessionRegistry(lambda rid: object(), open_on_first_call=True, max_client=1)
    registry.get_or_open("a")
    with pytest.raises(TooManyRolloutsError):
        registry.get_or_open("b")
    registry.close("a")
    registry.get_or_open("b")
    assert registry.stats.client_rollouts_refused == 1 and len(registry) == 1


async def test_an_oversized_body_is_refused_before_it_is_parsed_and_health_stays_up(
    scripted, qwen_tokenizer
):
    huge = b"{" + b"x" * (10 * 1024 * 1024)  # not even JSON: a 400 would mean it was parsed

    async def chunks(count: int, size: int = 1024):
        for _ in range(count):
            yield b" " * size

    async with _gateway(scripted, qwen_tokenizer, max_request_bytes=64 * 1024) as gw, \
            _client(gw) as client:
        gw.open("r")
        declared, health = await asyncio.gather(
            client.post("/rollouts/r/v1/chat/completions", content=huge,
                        headers={"Content-Type": "application/json"}),
            client.get("/health"),
        )
        chunked = await client.post("/rollouts/r/v1/chat/completions", content=chunks(100),
                                    headers={"Content-Type": "application/json"})
        small_chunked = await client.post(
            "/rollouts/r/reward", content=_one_chunk(b'{"value": 0.5}'),
            headers={"Content-Type": "application/json"})

    assert _code(declared, 413) == _code(chunked, 413) == "request_too_large"
    assert "max_request_bytes" in declared.json()["error"]["message"]
    assert health.status_code == 200
    assert small_chunked.status_code == 200, small_chunked.text  # under the limit: replayed
    assert gw.stats.requests_too_large == 2
    assert gw.close("r").calls == []  # nothing reached the tokenizer or the engine


async def _one_chunk(data: bytes):
    yield data


def test_the_default_limit_is_a_few_megabytes():
    assert 1024 * 1024 <= GatewayConfig().max_request_bytes <= 8 * 1024 * 1024


def test_an_open_bind_without_auth_is_refused_unless_allowed():
    for host in ("0.0.0.0", "::", "10.1.2.3", "gateway.example"):
        with pytest.raises(ValidationError, match="allow_unauthenticated_remote"):
            GatewayConfig(host=host, auth=False)
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert not GatewayConfig(host=host, auth=False).open_to_anyone
    assert GatewayConfig(host="0.0.0.0", auth=True).open_to_anyone is False
    assert GatewayConfig(host="0.0.0.0", auth=False, allow_unauthenticated_remote=True).open_to_anyone


def test_cli_refuses_an_open_bind_without_auth_with_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["gateway", str(tmp_path), "--host", "0.0.0.0", "--no-auth"])

    assert result.exit_code == 2
    assert "--i-know-its-open" in result.stderr and "Traceback" not in result.output


async def test_an_allowed_open_bind_warns_loudly(scripted, qwen_tokenizer, caplog):
    config = GatewayConfig(host="0.0.0.0", auth=False, allow_unauthenticated_remote=True)
    with caplog.at_level(logging.WARNING, logger="agentrl_sdk.gateway"):
        async with Gateway(scripted(qwen_tokenizer, []), qwen_tokenizer, config=config):
            pass

    (record,) = [r for r in caplog.records if "NO AUTH" in r.getMessage()]
    assert record.levelno == logging.WARNING and "0.0.0.0" in record.getMessage()
