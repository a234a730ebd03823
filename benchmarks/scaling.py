"""How the SDK's cost grows: log-log exponents of time and memory against scale.

    python benchmarks/scaling.py [--quick]

Every model call is answered at once by a null engine (a fixed tool-call reply), so the
figures measure the SDK (LangGraph runs, TokenChatModel, the token ledger, templates,
tokenization), not a model. The real Qwen tokenizer and its Hermes template render prompts.
Each curve is fitted as ``cost = a * x**k`` by least squares on logs; ``k`` is the figure:

- `turns_exponent`: time of one rollout against its turns (1 -> 64 calls of one growing
  conversation through `TokenChatModel.ainvoke`; tokens grow linearly with turns).
  Baseline: the same with the ledger rendering the whole history twice per call, as it did
  before windowed rendering (`agentrl_sdk.chat.delta`). Goal <= 1.1.
- `rollouts_exponent`: time *per rollout* against rollouts per step (64 -> 1024 graph
  rollouts at once through `sdk.arollout_batch`, 4 calls each). Goal <= 0 (no growth).
  Baseline: the same with Python's cyclic garbage collector off during each step: what the
  collector adds as more rollouts' objects stay alive at once
  (`agentrl_sdk.rollout.collector_gc` keeps it small). `live_kb_per_rollout`: the live Python
  objects of a rollout mid-step (traced), and the share the SDK's own code allocated: with
  1,024 at once they outgrow the CPU's last-level cache, so each rollout resumes on memory
  the others evicted.
- `prompt_length_exponent`: time of a two-call rollout against the length of its first
  prompt (1k -> 16k tokens). Linear is 1.
- `memory_turns_exponent`: bytes a finished rollout keeps (ledger, trajectory; traced
  allocations) against its turns. Baseline: the same plus a copy of every call's prompt, as
  `LLMCall.prompt_ids` kept before calls became offsets into their segment.
- `rss_rollouts_exponent`: peak RSS growth of a fresh process running N rollouts at once
  (64 -> 1024, 16 calls each) against N. Linear is 1.

Times are CPU seconds of this process (``time.process_time``: with a null engine all the
work is the SDK's, in this process), so other load on a shared machine does not inflate them;
each is a median of repeats. The exponents (ratios of times in one run) are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psutil
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool as make_tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from rich.console import Console
from rich.table import Table

import agentrl_sdk as sdk
from agentrl_sdk import RolloutConfig, SamplingParams, TokenChatModel
from agentrl_sdk.chat import ChatTemplate, RolloutRecorder, TokenLedger, current_recorder
from agentrl_sdk.config import ChatConfig
from agentrl_sdk.models import build_qwen_tokenizer
from agentrl_sdk.types import GenerateResult
from benchmarks._results import RESULTS_DIR, write_result

REPLY = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
OBSERVATION = "result {k}: 42. The calculator also says: all inputs were valid integers."
GRAPH_CALLS = 4


@make_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


class NullEngine:
    """Answers every request at once with the same tool call: no model time at all."""

    def __init__(self, template: ChatTemplate) -> None:
        self.ids = template.encode(REPLY) + template.encode("<|im_end|>")

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       *, session_id: str | None = None) -> GenerateResult:  # fmt: skip
        return GenerateResult(token_ids=self.ids, logprobs=[-0.1] * len(self.ids),
                              finish_reason="stop", policy_version=0)  # fmt: skip


class FullRenderLedger(TokenLedger):
    """The baseline ledger: both sides of every follow-up rendered in full (the old cost)."""

    def _delta(self, conv, messages, tools, key):
        if key != conv.tools_key:
            return None
        return self.template.deltas.full_delta(conv.messages, messages, tools)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """``(k, a)`` of the least-squares line ``log y = log a + k log x``."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    k = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )
    return k, math.exp(my - k * mx)


# ---- turns and prompt length: one conversation through TokenChatModel ----------------------


async def conversation(
    llm: TokenChatModel, template: ChatTemplate, engine: NullEngine, turns: int, tag: str,
    *, question: str = "What is 6*7?", full_render: bool = False,
) -> tuple[float, RolloutRecorder]:
    """Seconds of one rollout of ``turns`` calls, and its recorder (ledger)."""
    recorder = RolloutRecorder(engine, template, sampling=SamplingParams(max_tokens=64),
                               chat=ChatConfig(max_context_tokens=1 << 16), rollout_id=tag)
    if full_render:
        recorder.ledger = FullRenderLedger(template)
    token = current_recorder.set(recorder)
    try:
        # Text unique to the rollout: nothing is served from the encode cache whole.
        messages = [SystemMessage("You are a calculator agent."), HumanMessage(f"[{tag}] {question}")]
        start = time.process_time()
        for k in range(turns):
            reply = await llm.ainvoke(messages)
            messages += [reply, ToolMessage(f"[{tag}] " + OBSERVATION.format(k=k),
                                            tool_call_id=reply.tool_calls[0]["id"])]
        return time.process_time() - start, recorder
    finally:
        current_recorder.reset(token)


async def turns_curve(llm, template, engine, points: list[int], repeats: int,
                      full_render: bool) -> list[float]:  # fmt: skip
    """Median seconds of a rollout at each number of turns."""
    out = []
    for turns in points:
        runs = max(repeats, 64 // turns)  # short rollouts repeat more: they are noisier
        times = [(await conversation(llm, template, engine, turns, f"t{turns}-{full_render}-{r}",
                                     full_render=full_render))[0] for r in range(runs)]
        out.append(statistics.median(times))
    return out


async def prompt_curve(llm, template, engine, points: list[int], repeats: int) -> list[float]:
    """Median seconds of a two-call rollout whose question is ``length`` tokens long."""
    filler = "The quick brown fox jumps over the lazy dog near the river bank. "
    per_filler = len(template.encode(filler))
    out = []
    for length in points:
        times = []
        for r in range(repeats):
            question = f"{r} " + filler * (length // per_filler) + "What is 6*7?"
            seconds, _ = await conversation(llm, template, engine, 2, f"p{length}-{r}",
                                            question=question)  # fmt: skip
            times.append(seconds)
        out.append(statistics.median(times))
    return out


async def kept_bytes(llm, template, engine, turns: int) -> tuple[int, int]:
    """Bytes a finished rollout of ``turns`` keeps (its ledger, as a trajectory keeps it), and
    the bytes of a copy of every call's prompt (what ``LLMCall.prompt_ids`` held before)."""
    gc.collect()
    tracemalloc.start()
    _, recorder = await conversation(llm, template, engine, turns, f"m{turns}")
    # The conversation's messages and LangChain's run objects are gone; the ledger is not.
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0]
    copies = [call.prompt_ids for call in recorder.ledger.calls]
    with_copies = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del copies
    return kept, with_copies


# ---- rollouts per step and RSS: graph rollouts through sdk.arollout_batch -----------------


class State(TypedDict):
    messages: Annotated[list, add_messages]
    calls: int


@sdk.trainable("agent")
async def agent(state: State, config: RunnableConfig) -> dict:
    return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}


async def tool(state: State) -> dict:
    call = state["messages"][-1].tool_calls[0]
    k = sum(isinstance(m, AIMessage) for m in state["messages"])
    return {"messages": [ToolMessage(OBSERVATION.format(k=k), tool_call_id=call["id"])]}


def route(state: State) -> str:
    made = sum(isinstance(m, AIMessage) for m in state["messages"])
    return "tool" if made < state["calls"] else END


def build_graph() -> Any:
    """agent -> (tool -> agent) * (calls - 1) -> end."""
    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tool", tool)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tool", END])
    graph.add_edge("tool", "agent")
    return graph.compile()


def rows(count: int, calls: int, salt: str) -> list[dict[str, Any]]:
    return [{"question": f"[{salt}-{i}] What is {i}*7?", "calls": calls} for i in range(count)]


def graph_input(row: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [SystemMessage("You are a calculator agent."),
                         HumanMessage(row["question"])], "calls": row["calls"]}  # fmt: skip


async def step(graph, engine, tokenizer, rollouts: int, calls: int, salt: str) -> list:
    """One step's rollouts, all at once: ``rollouts / 8`` rows, 8 samples each."""
    config = RolloutConfig(n=8, concurrency=rollouts)
    trajs = await sdk.arollout_batch(graph, rows(rollouts // 8, calls, salt), engine,
                                     tokenizer=tokenizer, config=config, input_fn=graph_input)
    bad = [t.error for t in trajs if t.status != "ok"]
    assert not bad and all(len(t.calls) == calls for t in trajs), bad[:1]
    return trajs


async def rollouts_curves(graph, engine, tokenizer, points: list[int],
                          rounds: int) -> tuple[list[float], list[float]]:  # fmt: skip
    """Median seconds per rollout at each number of rollouts per step: with Python's cyclic
    garbage collector as the SDK sets it, and off during each step (collected after it).
    Alternating rounds (every point, both ways, ~1,024 rollouts each per round), so drift on
    the machine spreads over every point instead of bending the curve."""
    times: dict[tuple[int, bool], list[float]] = {}
    for r in range(rounds):
        for rollouts in points:
            for collector in (True, False):
                for i in range(max(1, 1024 // rollouts)):  # small steps repeat more: noisier
                    if not collector:
                        gc.disable()
                    start = time.process_time()
                    await step(graph, engine, tokenizer, rollouts, GRAPH_CALLS,
                               f"n{rollouts}-{collector}-{r}-{i}")  # fmt: skip
                    elapsed = (time.process_time() - start) / rollouts
                    times.setdefault((rollouts, collector), []).append(elapsed)
                    gc.enable()
                    gc.collect()
    return ([statistics.median(times[p, True]) for p in points],
            [statistics.median(times[p, False]) for p in points])  # fmt: skip


class SnapshotEngine(NullEngine):
    """A null engine that takes a tracemalloc snapshot at its ``at``-th call."""

    def __init__(self, template: ChatTemplate, at: int) -> None:
        super().__init__(template)
        self.at, self.calls, self.snapshot = at, 0, None

    async def generate(self, *args: Any, **kwargs: Any) -> GenerateResult:
        self.calls += 1
        if self.calls == self.at:
            self.snapshot = tracemalloc.take_snapshot()
        return await super().generate(*args, **kwargs)


async def live_memory(graph, template, tokenizer, rollouts: int) -> tuple[float, float]:
    """kB of live Python objects per rollout mid-step (every rollout started, half in their last
    call), and the share of them allocated by agentrl_sdk's own code (the rest: LangGraph,
    LangChain, pydantic, asyncio)."""
    engine = SnapshotEngine(template, at=int((GRAPH_CALLS - 0.5) * rollouts))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        await step(graph, engine, tokenizer, rollouts, GRAPH_CALLS, "live")
    finally:
        tracemalloc.stop()
    assert engine.snapshot is not None
    grown = [d for d in engine.snapshot.compare_to(before, "filename") if d.size_diff > 0]
    total = sum(d.size_diff for d in grown)
    sdk_dir = f"{os.sep}agentrl_sdk{os.sep}"
    own = sum(d.size_diff for d in grown if sdk_dir in d.traceback[0].filename)
    return total / rollouts / 1e3, own / total


def last_level_cache_bytes() -> int | None:
    """Size of CPU 0's largest cache (Linux sysfs), None where unknown."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * unit)
    return max(sizes, default=None)


def rss_child(rollouts: int, calls: int) -> None:
    """In a fresh process: peak RSS growth (bytes, sampled every 2 ms) over one step of
    ``rollouts`` at once, whose trajectories are kept to the end (as a trainer keeps a step's
    trajectories), printed as JSON."""
    tokenizer = build_qwen_tokenizer("hermes")
    engine = NullEngine(ChatTemplate(tokenizer))
    graph = build_graph()
    asyncio.run(step(graph, engine, tokenizer, 8, calls, "warm"))  # imports, caches, pools
    gc.collect()
    process = psutil.Process()
    before = peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    trajs = asyncio.run(step(graph, engine, tokenizer, rollouts, calls, "rss"))
    done.set()
    sampler.join()
    peak = max(peak, process.memory_info().rss)
    tokens = sum(s.length for t in trajs for s in t.segments)
    print(json.dumps({"bytes": peak - before, "tokens": tokens}))


def rss_curve(points: list[int], calls: int) -> list[dict[str, int]]:
    out = []
    for rollouts in points:
        done = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(rollouts), str(calls)],
            check=True, capture_output=True, text=True,
        )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


# ---- report ---------------------------------------------------------------------------------


def plot(curves: list[tuple[str, str, list[float], list[float], float, float]], path: Path) -> bool:
    """Measured points and fitted lines, one log-log panel per curve; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    columns = 3
    rows = -(-len(curves) // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.6 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(curves) :]:
        ax.set_visible(False)
    for ax, (title, xlabel, xs, ys, k, a) in zip(axes, curves, strict=False):
        ax.loglog(xs, ys, "o", label="measured")
        ax.loglog(xs, [a * x**k for x in xs], "-", label=f"fit: x^{k:.2f}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("agentrl_sdk scaling (null engine)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


async def main(quick: bool) -> None:
    tokenizer = build_qwen_tokenizer("hermes")
    template = ChatTemplate(tokenizer)
    engine = NullEngine(template)
    llm = TokenChatModel().bind_tools([calculator])
    graph = build_graph()
    turns = [1, 2, 4, 8, 16, 32] if quick else [1, 2, 4, 8, 16, 32, 64]
    lengths = [1024, 2048, 4096] if quick else [1024, 2048, 4096, 8192, 16384]
    steps = [16, 32, 64] if quick else [64, 128, 256, 512, 1024]
    rss_steps = [16, 64] if quick else [64, 128, 256, 512, 1024]
    repeats = 3 if quick else 5

    await conversation(llm, template, engine, 4, "warm")
    await step(graph, engine, tokenizer, 16, GRAPH_CALLS, "warm")
    progress = Console(stderr=True)
    progress.print("turns per rollout ...")
    t_new = await turns_curve(llm, template, engine, turns, repeats, full_render=False)
    t_old = await turns_curve(llm, template, engine, turns, repeats, full_render=True)
    progress.print("prompt length ...")
    t_len = await prompt_curve(llm, template, engine, lengths, repeats)
    progress.print("memory per rollout ...")
    memory = [await kept_bytes(llm, template, engine, t) for t in turns[1:]]
    progress.print("rollouts per step ...")
    t_step, t_step_off = await rollouts_curves(graph, engine, tokenizer, steps, repeats)
    live_kb, own_share = await live_memory(graph, template, tokenizer, steps[-1])
    progress.print("peak RSS (fresh processes) ...")
    rss = rss_curve(rss_steps, 16)

    k_turns, a_turns = fit(turns, t_new)
    k_turns_old, a_turns_old = fit(turns, t_old)
    k_len, a_len = fit(lengths, t_len)
    k_mem, a_mem = fit(turns[1:], [m[0] for m in memory])
    k_mem_old, _ = fit(turns[1:], [m[1] for m in memory])
    k_step, a_step = fit(steps, t_step)
    k_step_off, _ = fit(steps, t_step_off)
    rss_bytes = [max(r["bytes"], 1) for r in rss]
    k_rss, a_rss = fit(rss_steps, rss_bytes)

    table = Table(title="Scaling: fitted exponent k of cost = a * x^k (null engine)")
    for col in ("curve", "x range", "k", "baseline k", "goal", "ends"):
        table.add_column(col)
    ms = 1000
    table.add_row("rollout time vs turns", f"{turns[0]}-{turns[-1]}", f"{k_turns:.3f}",
                  f"{k_turns_old:.3f} (full renders)", "<= 1.1",
                  f"{t_new[0] * ms:.2f} -> {t_new[-1] * ms:.1f} ms "
                  f"(full renders: {t_old[-1] * ms:.1f} ms)")
    table.add_row("time per rollout vs rollouts/step", f"{steps[0]}-{steps[-1]}", f"{k_step:.3f}",
                  f"{k_step_off:.3f} (gc off)", "<= 0",
                  f"{t_step[0] * ms:.2f} -> {t_step[-1] * ms:.2f} ms")
    cache = last_level_cache_bytes()
    table.add_row("  live objects per rollout mid-step", str(steps[-1]), "", "", "",
                  f"{live_kb:.0f} kB ({own_share:.0%} the SDK's; {steps[-1]} at once: "
                  f"{steps[-1] * live_kb / 1e3:.0f} MB, last-level cache "
                  f"{cache / 2**20 if cache else float('nan'):.0f} MiB)")  # fmt: skip
    table.add_row("rollout time vs prompt tokens", f"{lengths[0]}-{lengths[-1]}", f"{k_len:.3f}",
                  "", "(1 = linear)", f"{t_len[0] * ms:.2f} -> {t_len[-1] * ms:.2f} ms")
    table.add_row("kept bytes vs turns", f"{turns[1]}-{turns[-1]}", f"{k_mem:.3f}",
                  f"{k_mem_old:.3f} (prompt copies)", "(1 = linear)",
                  f"{memory[0][0] / 1e3:.0f} -> {memory[-1][0] / 1e3:.0f} kB "
                  f"(with copies: {memory[-1][1] / 1e3:.0f} kB)")
    table.add_row("peak RSS growth vs concurrent rollouts", f"{rss_steps[0]}-{rss_steps[-1]}",
                  f"{k_rss:.3f}", "", "(1 = linear)",
                  f"{rss[0]['bytes'] / 1e6:.1f} -> {rss[-1]['bytes'] / 1e6:.1f} MB")
    Console().print(table)
    for name, (xs, ys) in {"turns (s)": (turns, t_new), "turns, full renders (s)": (turns, t_old),
                           "prompt tokens (s)": (lengths, t_len),
                           "rollouts/step (s per rollout)": (steps, t_step),
                           "rollouts/step, gc off (s per rollout)": (steps, t_step_off),
                           "rss rollouts (bytes)": (rss_steps, rss_bytes)}.items():
        print(f"  {name}: " + ", ".join(f"{x}: {y:.4g}" for x, y in zip(xs, ys, strict=True)))

    png = RESULTS_DIR / "scaling.png"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plotted = plot([
        ("rollout time vs turns", "turns", turns, t_new, k_turns, a_turns),
        ("same, full renders (before)", "turns", turns, t_old, k_turns_old, a_turns_old),
        ("time per rollout vs rollouts/step", "rollouts per step", steps, t_step, k_step, a_step),
        ("rollout time vs prompt tokens", "prompt tokens", lengths, t_len, k_len, a_len),
        ("kept bytes vs turns", "turns", turns[1:], [m[0] for m in memory], k_mem, a_mem),
        ("peak RSS growth vs rollouts", "concurrent rollouts", rss_steps, rss_bytes, k_rss, a_rss),
    ], png)  # fmt: skip
    print(f"plot: {png}" if plotted else "plot: matplotlib is not installed (pip install '.[bench]')")

    def figure(value: float | None, baseline: float | None, goal: float | None, unit: str) -> dict:
        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        ratio = None if value is None or baseline in (None, 0) else round(value / baseline, 4)
        return {"value": rounded(value), "baseline": rounded(baseline), "ratio": ratio,
                "goal": goal, "unit": unit}  # fmt: skip

    write_result("scaling", {
        "turns_exponent": figure(k_turns, k_turns_old, 1.1, "exponent (rollout time vs turns)"),
        "rollouts_exponent": figure(k_step, k_step_off, 0.0,
                                    "exponent (time per rollout vs rollouts per step; "
                                    "baseline: Python's cyclic GC off during steps)"),
        "live_kb_per_rollout": figure(live_kb, None, None,
                                      f"kB of live objects per rollout mid-step at {steps[-1]} "
                                      f"at once ({own_share:.0%} allocated by agentrl_sdk; "
                                      f"last-level cache {cache} bytes)"),
        "prompt_length_exponent": figure(k_len, None, None,
                                         "exponent (rollout time vs prompt tokens)"),
        "memory_turns_exponent": figure(k_mem, k_mem_old, None,
                                        "exponent (kept bytes vs turns; baseline: prompt copies)"),
        "rss_rollouts_exponent": figure(k_rss, None, None,
                                        "exponent (peak RSS growth vs concurrent rollouts)"),
        "call_ms_at_most_turns": figure(t_new[-1] / turns[-1] * ms, t_old[-1] / turns[-1] * ms, None,
                                   f"ms per call at {turns[-1]} turns (baseline: full renders)"),
        "kept_kb_at_most_turns": figure(memory[-1][0] / 1e3, memory[-1][1] / 1e3, None,
                                     f"kB kept by a {turns[-1]}-turn rollout "
                                     "(baseline: with prompt copies)"),
        "rss_per_rollout_kb": figure(rss[-1]["bytes"] / rss_steps[-1] / 1e3, None, None,
                                     f"kB peak RSS per rollout at {rss_steps[-1]} at once "
                                     f"({rss[-1]['tokens'] // rss_steps[-1]} tokens each)"),
    })  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        rss_child(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    asyncio.run(main(parser.parse_args().quick))
