"""Recording-gateway overhead per chat call, against the bare engine call it wraps.

    python benchmarks/gateway.py [--quick]

4-turn conversations (real Qwen tokenizer and Hermes template, real TorchEngine) are sent as
OpenAI chat-completion requests over loopback HTTP (httpx, keep-alive) to the gateway, which
records each call into the rollout's token ledger through `TokenChatModel`. Time spent inside
`engine.generate` is measured separately; the rest is the gateway: the client's HTTP request,
uvicorn, FastAPI and pydantic parsing, message conversion, the chat-model adapter (templating,
prefix checks, tokenization, parsing, ledger) and the JSON response. Figures:

- `gateway_overhead_ms`: the median call's time when the engine answers at once (the same
  conversations replayed against the answers the real engine gave; prompts asserted
  identical). This is the cost next to a GPU or remote engine. The median, because on a
  shared 2-core machine other tenants' bursts land on a few calls;
  `gateway_overhead_mean_ms` is the mean of the same calls.
- `gateway_overhead_in_process_ms`: time outside `generate` with the real in-process engine
  on the same 2 cores (its forward passes also slow the Python around them).
- `direct_chat_model_ms`: the same replayed calls made in-process through
  `TokenChatModel.ainvoke` (as a LangGraph node makes them, LangChain's plumbing included),
  for reference: what a recorded call costs with no HTTP in between.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from langchain_core.messages import convert_to_messages  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl_sdk import RolloutConfig, SamplingParams, TokenChatModel  # noqa: E402
from agentrl_sdk.chat import ChatTemplate, RolloutRecorder, current_recorder  # noqa: E402
from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.gateway import Gateway  # noqa: E402
from agentrl_sdk.models import build_qwen_tokenizer, build_tiny_model  # noqa: E402
from benchmarks._harness import ReplayEngine, TimedEngine  # noqa: E402
from benchmarks._results import write_result  # noqa: E402

TURNS = 4
CONFIG = RolloutConfig(sampling=SamplingParams(max_tokens=8, seed=1))


def _question(index: int) -> list[dict]:
    return [{"role": "system", "content": "You are a calculator agent."},
            {"role": "user", "content": f"What is {index}*{index + 7}?"}]


async def over_http(gateway: Gateway, client: httpx.AsyncClient, index: int) -> list[float]:
    """Wall seconds of each of one conversation's calls through the gateway."""
    rollout = f"c{index}-{time.perf_counter_ns()}"
    gateway.open(rollout)
    messages = _question(index)
    walls = []
    for turn in range(TURNS):
        start = time.perf_counter()
        reply = await client.post(f"/rollouts/{rollout}/v1/chat/completions",
                                  json={"model": "agentrl", "messages": messages})
        reply.raise_for_status()
        message = reply.json()["choices"][0]["message"]
        walls.append(time.perf_counter() - start)
        messages = [*messages, message,
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": f"result {turn}: 42"}]
    gateway.close(rollout)
    return walls


async def gateway_ms(engine, tokenizer, conversations: int, offset: int) -> tuple[float, float]:
    """Milliseconds per call outside ``engine.generate`` through the gateway over HTTP: the
    mean, and the median call (robust to other tenants of a shared machine; only meaningful
    when the engine answers at once)."""
    async with Gateway(engine, tokenizer, rollout=CONFIG) as gateway:
        headers = {"Authorization": f"Bearer {gateway.api_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
            await over_http(gateway, client, -1)  # warm-up (connection, caches)
            engine.seconds = 0.0
            walls: list[float] = []
            for index in range(conversations):
                walls += await over_http(gateway, client, offset + index)
    mean = (sum(walls) - engine.seconds) / len(walls) * 1000
    return mean, statistics.median(walls) * 1000


async def direct_ms(engine, template: ChatTemplate, conversations: int, offset: int) -> float:
    """Milliseconds per call of the same replayed calls made through TokenChatModel directly."""
    llm = TokenChatModel(model_name="agentrl")
    wall = 0.0
    for index in range(conversations):
        recorder = RolloutRecorder(engine, template, chat=CONFIG.chat, sampling=CONFIG.sampling,
                                   rollout_id=f"d{index}")
        token = current_recorder.set(recorder)
        try:
            messages = convert_to_messages(_question(offset + index))
            start = time.perf_counter()
            for turn in range(TURNS):
                reply = await llm.ainvoke(messages)
                messages = [*messages, reply, *convert_to_messages([
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": f"result {turn}: 42"}
                ])]
            wall += time.perf_counter() - start
        finally:
            current_recorder.reset(token)
    return wall / (conversations * TURNS) * 1000


async def main(quick: bool) -> None:
    tokenizer = build_qwen_tokenizer("hermes")
    engine = TorchEngine(build_tiny_model(tokenizer, hidden_size=32, num_layers=1))
    timed = TimedEngine(engine)
    conversations = 5 if quick else 30
    in_process, _ = await gateway_ms(timed, tokenizer, conversations, 0)
    engine_ms = timed.seconds / (conversations * TURNS) * 1000
    engine.close()
    replay = ReplayEngine(timed.answers)
    # Replays repeat the very conversations (greedy not needed: the answers are replayed).
    runs = [await gateway_ms(replay, tokenizer, conversations, 0) for _ in range(3)]
    replayed_mean = statistics.median(mean for mean, _ in runs)
    replayed = statistics.median(median for _, median in runs)
    adapter = statistics.median(
        [await direct_ms(replay, ChatTemplate(tokenizer), conversations, 0) for _ in range(3)]
    )

    table = Table(title=f"Recording gateway overhead per call ({conversations * TURNS} calls)")
    for col in ("bare engine call", "gateway (replayed, median)", "(replayed, mean)",
                "gateway (in-process engine)", "TokenChatModel.ainvoke direct", "goal"):
        table.add_column(col)
    table.add_row(f"{engine_ms:.2f} ms", f"{replayed:.3f} ms", f"{replayed_mean:.3f} ms",
                  f"{in_process:.3f} ms", f"{adapter:.3f} ms", "< 2 ms")
    Console().print(table)

    def figure(value: float) -> dict:
        return {"value": round(value, 4), "baseline": round(engine_ms, 4),
                "ratio": round(value / engine_ms, 4), "goal": 2.0, "unit": "ms"}

    write_result("gateway", {
        "gateway_overhead_ms": figure(replayed),
        "gateway_overhead_mean_ms": figure(replayed_mean),
        "gateway_overhead_in_process_ms": figure(in_process),
        "direct_chat_model_ms": figure(adapter),
    })


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    asyncio.run(main(parser.parse_args().quick))
