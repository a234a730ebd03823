"""VLLMServerEngine's client side without vLLM: a fake server (httpx.MockTransport) or none."""

from __future__ import annotations

import asyncio
import json
import stat
import sys

import httpx
import pytest
from transformers import LlamaConfig

from agentrl_sdk.engines.vllm.resumable import ResumableRequests
from agentrl_sdk.engines.vllm.server import VLLMServerEngine
from agentrl_sdk.tracing.server import free_port
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams

EOS = 2
ANSWER = [(11, -0.5, None), (12, -0.25, None), (EOS, -0.125, "stop")]  # id, logprob, finish


def _event(token: int, logprob: float, finish: str | None) -> bytes:
    choice = {"index": 0, "text": "", "token_ids": [token], "finish_reason": finish,
              "logprobs": {"token_logprobs": [logprob], "tokens": [f"token_id:{token}"]}}  # fmt: skip
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


class FakeServer(VLLMServerEngine):
    """A VLLMServerEngine whose HTTP calls go to ``handler`` instead of a vLLM server."""

    def __init__(self, handler) -> None:
        self._handler = handler
        super().__init__(url="http://fake-vllm", eos_token_ids=(EOS,), start_timeout_s=5)

    async def _connect(self) -> tuple[httpx.AsyncClient, ResumableRequests]:
        transport = httpx.MockTransport(self._handler)
        client = httpx.AsyncClient(base_url=self.url, transport=transport)
        return client, ResumableRequests(lambda _: self._version)


async def test_a_pause_after_the_last_token_completes_the_request_instead_of_resending_it():
    """The finish reason arrives with the last token, [DONE] a moment later: a pause in between
    must not resend the request with its EOS inside the prompt."""
    prompts: list[list[int]] = []

    async def stream():
        for token in ANSWER:
            yield _event(*token)
        await asyncio.sleep(0.5)  # the pause lands here, before the end of the stream
        yield b"data: [DONE]\n\n"

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        prompts.append(json.loads(request.content)["prompt"])
        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    engine = FakeServer(handler)
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=16)
        running = asyncio.ensure_future(engine.generate([5, 6, 7], sampling, "r-0"))

        async def received() -> int:
            return engine._requests.tokens_in_flight()

        while await engine._loop.call(received()) < len(ANSWER):
            await asyncio.sleep(0.005)
        await engine.pause()
        result = await asyncio.wait_for(running, 5)  # done while still paused
        await engine.resume()
        await asyncio.sleep(0.1)
        assert result.token_ids == [t for t, _, _ in ANSWER]
        assert result.logprobs == [lp for _, lp, _ in ANSWER]
        assert result.finish_reason == "stop"
        assert prompts == [[5, 6, 7]]  # sent once: nothing sampled past the EOS
        assert engine._requests.resubmissions == 0
    finally:
        engine.close()


async def test_a_pause_before_the_last_token_resends_prompt_and_partial_output():
    """The counterpart: a request cut before its finish is resumed from its partial output."""
    prompts: list[list[int]] = []

    async def stream(context: list[int]):
        sent = len(context) - 3
        for token in ANSWER[sent:]:
            if not sent and token[0] == EOS:
                await asyncio.sleep(0.5)  # first submission: the pause lands before the EOS
            yield _event(*token)
        yield b"data: [DONE]\n\n"

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        prompts.append(json.loads(request.content)["prompt"])
        return httpx.Response(200, content=stream(prompts[-1]))

    engine = FakeServer(handler)
    try:
        running = asyncio.ensure_future(
            engine.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=16), "r-0")
        )

        async def received() -> int:
            return engine._requests.tokens_in_flight()

        while await engine._loop.call(received()) < 2:
            await asyncio.sleep(0.005)
        await engine.pause()
        await asyncio.sleep(0.1)
        assert not running.done()
        await engine.resume()
        result = await asyncio.wait_for(running, 5)
        assert result.token_ids == [t for t, _, _ in ANSWER]
        assert result.finish_reason == "stop"
        assert prompts == [[5, 6, 7], [5, 6, 7, 11, 12]]
        assert engine._requests.resubmissions == 1
    finally:
        engine.close()


async def test_unreachable_url_fails_with_a_clear_error() -> None:
    with pytest.raises(EngineError, match="not healthy within 1s"):
        VLLMServerEngine(
            url=f"http://127.0.0.1:{free_port()}", eos_token_ids=(), start_timeout_s=1
        )


def _fake_server(tmp_path, monkeypatch, line: str):
    """Without vLLM: a model folder, and a "python" that prints ``line`` and exits with 3."""
    model = tmp_path / "model"
    # A config the CPU arguments can read (head size 64, which vLLM-CPU serves).
    LlamaConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=1,
                intermediate_size=64, vocab_size=100).save_pretrained(model)  # fmt: skip
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\necho "{line}"\nexit 3\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(fake))
    return model


def test_a_server_that_exits_at_start_reports_its_code_and_log(tmp_path, monkeypatch) -> None:
    model = _fake_server(tmp_path, monkeypatch, "fake server: $*")
    with pytest.raises(EngineError, match="exited with code 3") as info:
        VLLMServerEngine(model, eos_token_ids=(), server_args=["--max-num-batched-tokens", "many"],
                         start_timeout_s=30)  # fmt: skip
    assert "fake server: -m vllm.entrypoints.openai.api_server" in str(info.value)
    assert "--max-num-batched-tokens many" in str(info.value)


@pytest.mark.parametrize(("server_args", "kv_space"), [
    ([], "4"),  # vLLM-CPU's default (a fraction of all RAM) refuses to start on a shared host
    (["--kv-cache-memory-bytes", "268435456"], ""),  # the user's size, not overridden
    (["--kv-cache-memory-bytes=268435456"], ""),
])  # fmt: skip
def test_a_started_server_keeps_a_kv_cache_sized_in_its_arguments(
    tmp_path, monkeypatch, server_args, kv_space
) -> None:
    model = _fake_server(tmp_path, monkeypatch, "kv space: [$VLLM_CPU_KVCACHE_SPACE]")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with pytest.raises(EngineError, match="exited with code 3") as info:
        VLLMServerEngine(model, eos_token_ids=(), server_args=server_args, start_timeout_s=30)
    assert f"kv space: [{kv_space}]" in str(info.value)
