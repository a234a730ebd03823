"""Chat-model + ledger overhead per LLM call, against the bare engine call it wraps.

    python benchmarks/overhead.py [--quick]

A 4-turn tool conversation (real Qwen tokenizer and Hermes template, real TorchEngine) is
driven through `TokenChatModel.ainvoke` inside a rollout recorder. Time spent inside
`engine.generate` is measured separately; the rest is the adapter: LangChain's own call
plumbing, message conversion, templating, prefix checks, tokenization, parsing and ledger
bookkeeping. Figures:

- `adapter_overhead_ms`: the adapter's time per call when the engine's answers come back at
  once: the same conversations replayed against the answers the real engine gave (prompts
  asserted identical, fresh encode cache). This is the cost next to a GPU or remote engine.
- `adapter_overhead_in_process_ms`: time outside `generate` with the real in-process engine.
  On this CPU the engine's forward passes (a 151k-row LM head) evict the caches the adapter's
  Python code runs from, so the same work takes ~3x longer than above.
- `langchain_floor_ms`: what LangChain's `BaseChatModel.ainvoke` costs around a chat model
  that does nothing, measured in the same run: part of every figure above.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentrl_sdk import SamplingParams, TokenChatModel  # noqa: E402
from agentrl_sdk.chat import ChatTemplate, RolloutRecorder, current_recorder  # noqa: E402
from agentrl_sdk.engines import TorchEngine  # noqa: E402
from agentrl_sdk.models import build_qwen_tokenizer, build_tiny_model  # noqa: E402
from benchmarks._harness import ReplayEngine, TimedEngine  # noqa: E402
from benchmarks._results import write_result  # noqa: E402


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


class NoopChatModel(BaseChatModel):
    """A chat model that does nothing: LangChain's own per-call cost."""

    @property
    def _llm_type(self) -> str:
        return "noop"

    def _generate(self, *args, **kwargs):
        raise NotImplementedError

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        return ChatResult(generations=[ChatGeneration(message=AIMessage("x"))])


async def one_conversation(llm, template, engine, turns: int, index: int) -> float:
    """Wall seconds of one conversation of ``turns`` calls."""
    recorder = RolloutRecorder(engine, template, sampling=SamplingParams(max_tokens=8, seed=1))
    token = current_recorder.set(recorder)
    try:
        # A new question each time: no conversation is served from the encode cache whole.
        question = HumanMessage(f"What is {index}*{index + 7}?")
        messages = [SystemMessage("You are a calculator agent."), question]
        start = time.perf_counter()
        for turn in range(turns):
            reply = await llm.ainvoke(messages)
            messages += [reply, ToolMessage(f"result {turn}: 42", tool_call_id=f"c{turn}")]
        return time.perf_counter() - start
    finally:
        current_recorder.reset(token)


async def measure(llm, template, engine, conversations: int, turns: int) -> float:
    """Adapter milliseconds per call outside ``engine.generate``."""
    engine.seconds = 0.0
    wall = 0.0
    for index in range(conversations):
        wall += await one_conversation(llm, template, engine, turns, index)
    return (wall - engine.seconds) / (conversations * turns) * 1000


async def langchain_floor(calls: int) -> float:
    llm = NoopChatModel().bind(tools=[{"type": "function"}])
    messages = [SystemMessage("s"), HumanMessage("h")]
    for _ in range(50):
        await llm.ainvoke(messages)
    start = time.perf_counter()
    for _ in range(calls):
        await llm.ainvoke(messages)
    return (time.perf_counter() - start) / calls * 1000


async def main(quick: bool) -> None:
    tokenizer = build_qwen_tokenizer("hermes")
    engine = TorchEngine(build_tiny_model(tokenizer, hidden_size=32, num_layers=1))
    timed = TimedEngine(engine)
    llm = TokenChatModel().bind_tools([calculator])
    conversations, turns = (5, 4) if quick else (30, 4)
    await one_conversation(llm, ChatTemplate(tokenizer), timed, turns, -1)  # warm-up
    timed.calls = 0
    in_process = await measure(llm, ChatTemplate(tokenizer), timed, conversations, turns)
    engine_ms = timed.seconds / timed.calls * 1000
    engine.close()
    replayed = statistics.median(
        [await measure(llm, ChatTemplate(tokenizer), ReplayEngine(timed.answers),
                       conversations, turns) for _ in range(3)]
    )
    floor = await langchain_floor(200 if quick else 2000)

    table = Table(title=f"TokenChatModel + ledger overhead per call ({conversations * turns} calls)")
    for col in ("bare engine call", "adapter (replayed)", "adapter (in-process engine)",
                "of which LangChain", "goal"):
        table.add_column(col)
    table.add_row(f"{engine_ms:.2f} ms", f"{replayed:.3f} ms", f"{in_process:.3f} ms",
                  f"{floor:.3f} ms", "< 0.5 ms")
    Console().print(table)

    def figure(value: float) -> dict:
        return {"value": round(value, 4), "baseline": round(engine_ms, 4),
                "ratio": round(value / engine_ms, 4), "goal": 0.5, "unit": "ms"}

    write_result(
        "overhead",
        {
            "adapter_overhead_ms": figure(replayed),
            "adapter_overhead_in_process_ms": figure(in_process),
            "langchain_floor_ms": figure(floor),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    asyncio.run(main(parser.parse_args().quick))
