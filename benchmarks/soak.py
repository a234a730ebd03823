"""Soak: 1,000 OpenAI-SDK agent rollouts through the recording gateway with ~1% injected faults.

    python benchmarks/soak.py [--quick] [--ray]

The calculator task as a plain OpenAI-SDK tool loop (2-3 chat completions with calculator
steps in between), 32 rollouts at a time, each run by `run_agent` exactly as `sdk.train` runs
an agent function: the gateway served by uvicorn on 127.0.0.1 in front of an `EnginePool` of
two replicas of the tiny warm-started calculator policy of tests/gateway: Ray engine actors
(``--ray``) or in-process `TorchEngine`s. Faults, drawn from a seeded generator:

- a calculator call raises (1% of tool steps): the agent raises, the rollout ends as
  ``graph_error``;
- a chat-completion connection is dropped mid-request (1% of HTTP attempts, 0-30 ms after the
  request is sent, so some drops land while the engine generates): the OpenAI SDK retries once;
  a rollout whose retry is dropped too ends as ``graph_error``;
- once, 40% of the way in, replica 0 dies with requests in flight: its Ray actor is
  SIGKILLed (``--ray``), or the in-process ``TorchEngine`` is closed; the pool drains it, moves
  its calls to the other replica, and rebuilds it (``restart=``).

Figures: `lost` (rollouts started with no trajectory, goal 0), `duplicated` (rollout ids
collected more than once, goal 0), `rss_growth_mb` (this process, which holds gateway, clients
and in-process engines: RSS at the end minus after warm-up, both after ``gc.collect()``; Ray
engine actors are traced apart), and the client-side latency of each LLM call
(`llm_call_p50_ms`, `llm_call_p99_ms`; retries included; the p99 of the calls clear of the
engine kill beside it). Also recorded: statuses, faults injected, calls the gateway recorded that no client
saw (a dropped request the engine still answered: `orphan_calls`), trajectories changed after
their rollout closed, rollouts still open at the end, pool reroutes and restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import agentrl_sdk as sdk  # noqa: E402
from agentrl_sdk.chat import ChatTemplate  # noqa: E402
from agentrl_sdk.engines import Engine, EnginePool, TorchEngine  # noqa: E402
from agentrl_sdk.models import load_pretrained_pair  # noqa: E402
from agentrl_sdk.rollout.agents import AgentEndpoint, build_gateway, run_agent  # noqa: E402
from agentrl_sdk.types import Trajectory  # noqa: E402
from benchmarks._results import write_result  # noqa: E402
from examples.calculator.calculator import calculate  # noqa: E402
from examples.openai_agent.agent import TOOLS  # noqa: E402
from tests.gateway.conftest import CALC_ROWS, calc_model_dir  # noqa: E402

CONCURRENCY = 32
FAULT_RATE = 0.01
KILL_AT = 0.4  # fraction of the rollouts started when replica 0 is closed
MAX_TURNS = 4
CONFIG = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48),
                           timeout_s=300.0)  # fmt: skip


class ToolFault(RuntimeError):
    """The injected failure of a calculator call."""


class Faults:
    """Seeded fault decisions and their counts."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        self.rate = rate
        self._rng = random.Random(seed)
        self.counts: Counter[str] = Counter()

    def draw(self, kind: str) -> bool:
        """Whether this ``kind`` event fails (counted when it does)."""
        hit = self._rng.random() < self.rate
        self.counts[kind] += hit
        return hit

    def delay_s(self) -> float:
        return self._rng.uniform(0.0, 0.03)


class DroppingTransport(httpx.AsyncBaseTransport):
    """Sends each request; for a drawn few, closes the connection mid-request and raises
    ``httpx.ReadError`` as a reset connection would."""

    def __init__(self, faults: Faults) -> None:
        self._inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))
        self._faults = faults

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not (request.url.path.endswith("/chat/completions")
                and self._faults.draw("dropped_connection")):  # fmt: skip
            return await self._inner.handle_async_request(request)
        task = asyncio.create_task(self._inner.handle_async_request(request))
        await asyncio.sleep(self._faults.delay_s())
        task.cancel()  # httpcore closes the cancelled request's connection
        try:
            response = await task
            await response.aclose()  # it finished first: drop it unread all the same
        except asyncio.CancelledError:
            pass
        raise httpx.ReadError("connection dropped (injected)", request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class SoakAgent:
    """The calculator tool loop with the OpenAI SDK; counts the replies each rollout got and
    times each call as the client sees it (retries included)."""

    def __init__(self, http: httpx.AsyncClient, faults: Faults) -> None:
        self.http = http
        self.faults = faults
        self.calls: list[tuple[float, float]] = []  # (start, end) on the perf clock
        self.answered: Counter[str] = Counter()

    async def __call__(self, endpoint: AgentEndpoint, row: dict[str, Any]) -> list[dict]:
        client = endpoint.client(http_client=self.http, max_retries=1, timeout=120)
        messages: list[dict[str, Any]] = list(row["messages"])
        for _ in range(MAX_TURNS):
            start = time.perf_counter()
            reply = await client.chat.completions.create(
                model=endpoint.model, messages=messages, tools=TOOLS, tool_choice="auto"
            )
            self.calls.append((start, time.perf_counter()))
            self.answered[row["soak_id"]] += 1
            message = reply.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                if self.faults.draw("tool_exception"):
                    raise ToolFault("calculator failed (injected)")
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": _calculator(call["function"])})
        return messages


def _calculator(function: dict[str, Any]) -> str:
    try:
        value = calculate(json.loads(function["arguments"])["expression"])
    except Exception as exc:  # noqa: BLE001 - the model sees the error
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _size(traj: Trajectory) -> tuple[int, int]:
    """What a trajectory holds: its calls and its tokens (to see it change after close)."""
    return len(traj.calls), sum(len(s.prompt_ids) + len(s.response_ids) for s in traj.segments)


def _rss_mb(pool: EnginePool) -> tuple[float, float]:
    """RSS of this process (gateway, clients, in-process engines), and of the engine actors
    (none with in-process engines), after a ``gc.collect()``."""
    gc.collect()
    actors = 0
    for pid in {r.pid for r in pool.replicas if hasattr(r, "pid")}:
        with contextlib.suppress(psutil.Error):  # a killed actor has no RSS left
            actors += psutil.Process(pid).memory_info().rss
    return psutil.Process().memory_info().rss / 2**20, actors / 2**20


class Tally:
    """What came back, kept small so that RSS measures the gateway, not this tally: each
    trajectory's id, status and call count; the last ``RECHECK`` trajectories themselves,
    compared with their size at close when they leave (a call landing after close shows)."""

    RECHECK = 2 * CONCURRENCY

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ids: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.calls_recorded = 0
        self.changed_after_close = 0
        self.raised: list[str] = []
        self._recent: deque[tuple[Trajectory, tuple[int, int]]] = deque()

    def collect(self, traj: Trajectory) -> None:
        self.ids[traj.row_id] += 1
        self.statuses[traj.status] += 1
        self.calls_recorded += len(traj.calls)
        self._recent.append((traj, _size(traj)))
        while len(self._recent) > self.RECHECK:
            self._recheck(*self._recent.popleft())

    def finish(self) -> None:
        while self._recent:
            self._recheck(*self._recent.popleft())

    def _recheck(self, traj: Trajectory, size: tuple[int, int]) -> None:
        self.changed_after_close += _size(traj) != size


def _replicas(folder: Path, ray_actors: bool) -> tuple[Callable[[int], Engine], Callable]:
    """How to build a replica and how to kill one: a Ray engine actor SIGKILLed, or an
    in-process TorchEngine closed."""
    if not ray_actors:
        # The weights only: loading the tokenizer again (~2 s of Python) would stall the loop.
        return (lambda _: TorchEngine(AutoModelForCausalLM.from_pretrained(folder)),
                lambda engine: engine.close())  # fmt: skip
    from agentrl_sdk.engines.ray import RayEngine
    from agentrl_sdk.trainer import TrainerConfig, init_ray

    init_ray(TrainerConfig())
    return (lambda _: RayEngine("torch", str(folder)),
            lambda engine: os.kill(engine.pid, signal.SIGKILL))  # fmt: skip


async def soak(rollouts: int, ray_actors: bool) -> dict[str, Any]:
    """Run the soak and return its counts."""
    folder = calc_model_dir()
    replica, kill_engine = _replicas(folder, ray_actors)
    _, tokenizer = load_pretrained_pair(folder)
    pool = EnginePool([replica(0), replica(1)], restart=replica, max_restarts=1)
    faults = Faults(FAULT_RATE)
    http = httpx.AsyncClient(transport=DroppingTransport(faults))
    agent = SoakAgent(http, faults)
    gateway = build_gateway(pool, ChatTemplate(tokenizer), CONFIG)
    tally = Tally()
    rss: dict[str, tuple[float, float]] = {"start": _rss_mb(pool)}
    warmup = min(2 * CONCURRENCY, rollouts // 4)
    gate = asyncio.Semaphore(CONCURRENCY)
    kill: dict[str, float] = {}

    async def kill_replica_0() -> None:
        kill["start"] = time.perf_counter()
        await asyncio.to_thread(kill_engine, pool.replicas[0])
        while pool.restarts + pool.failed_restarts == 0:
            await asyncio.sleep(0.05)
        kill["end"] = time.perf_counter()  # rebuilt and serving again

    async def one(i: int) -> None:
        async with gate:
            row_id = f"s{i}"
            tally.started.append(row_id)
            if len(tally.started) == int(KILL_AT * rollouts):  # calls in flight on both
                killing.append(asyncio.create_task(kill_replica_0()))
            row = {**CALC_ROWS[i % len(CALC_ROWS)], "soak_id": row_id}
            try:
                tally.collect(await run_agent(agent, row, row_id, 0, gateway, CONFIG))
            except Exception as exc:  # noqa: BLE001 - a rollout that raised is lost: count it
                tally.raised.append(f"{row_id}: {exc!r}")
            if (i + 1) % max(1, rollouts // 10) == 0:
                rss[f"at_{i + 1}"] = _rss_mb(pool)

    killing: list[asyncio.Task] = []
    begin = time.perf_counter()
    async with gateway:
        await asyncio.gather(*(one(i) for i in range(warmup)))
        rss["after_warmup"] = _rss_mb(pool)
        agent.calls.clear()  # steady state only
        await asyncio.gather(*(one(i) for i in range(warmup, rollouts)))
        await asyncio.gather(*killing)
        open_at_end = len(gateway.registry)
    await http.aclose()
    wall = time.perf_counter() - begin
    tally.finish()
    rss["end"] = _rss_mb(pool)  # the engines still loaded: only what the rollouts left behind
    pool.close()
    if ray_actors:
        import ray

        ray.shutdown()
    answered = sum(agent.answered.values())
    return {
        "rollouts": rollouts, "started": len(tally.started), "collected": tally.ids.total(),
        "lost": len(set(tally.started) - set(tally.ids)),
        "duplicated": sum(n - 1 for n in tally.ids.values()),
        "raised": tally.raised, "statuses": dict(tally.statuses),
        "changed_after_close": tally.changed_after_close, "open_at_end": open_at_end,
        "calls_answered": answered, "calls_recorded": tally.calls_recorded,
        "orphan_calls": tally.calls_recorded - answered, "faults": dict(faults.counts),
        "pool": {"reroutes": pool.reroutes, "restarts": pool.restarts,
                 "failed_restarts": pool.failed_restarts, "healthy": len(pool.healthy)},
        "gateway": gateway.stats.as_dict(), "calls": agent.calls, "kill": kill, "rss_mb": rss,
        "wall_s": wall, "engine_fault": "SIGKILL of a Ray engine actor" if ray_actors
        else "in-process TorchEngine closed",
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _latencies(out: dict[str, Any]) -> dict[str, float]:
    """p50 and p99 of every call (ms), and the p99 of the calls clear of the engine kill
    (ended before it, or started once the rebuilt replica served)."""
    kill = out["kill"]
    every = sorted((end - start) * 1000 for start, end in out["calls"])
    clear = sorted((end - start) * 1000 for start, end in out["calls"]
                   if not kill or end < kill["start"] or start > kill.get("end", 0.0))
    return {"p50": statistics.median(every), "p99": _percentile(every, 0.99),
            "p99_clear_of_kill": _percentile(clear, 0.99) if clear else float("nan"),
            "calls": len(every),
            "kill_window_s": round(kill["end"] - kill["start"], 2) if "end" in kill else None}


def _last_half(rss: dict[str, float], rollouts: int) -> float:
    """RSS growth over the second half of the rollouts (past the warm-up and the rebuild)."""
    samples = sorted((int(k[3:]), v[0]) for k, v in rss.items() if k.startswith("at_"))
    half = min(samples, key=lambda s: abs(s[0] - rollouts // 2))
    return samples[-1][1] - half[1]


def main(quick: bool, ray_actors: bool) -> None:
    out = asyncio.run(soak(100 if quick else 1000, ray_actors))
    lat = _latencies(out)
    rss = out["rss_mb"]
    growth = rss["end"][0] - rss["after_warmup"][0]

    table = Table(title=f"Soak: {out['rollouts']} rollouts, {FAULT_RATE:.0%} faults, "
                        f"{CONCURRENCY} at a time ({out['wall_s']:.0f} s)")  # fmt: skip
    for col in ("lost", "duplicated", "statuses", "orphan calls", "RSS growth",
                "p50 / p99 per call (under load)", "p99 clear of the kill"):
        table.add_column(col)
    table.add_row(str(out["lost"]), str(out["duplicated"]), json.dumps(out["statuses"]),
                  str(out["orphan_calls"]),
                  f"{growth:+.1f} MB ({_last_half(rss, out['rollouts']):+.1f} in 2nd half)",
                  f"{lat['p50']:.0f} / {lat['p99']:.0f} ms", f"{lat['p99_clear_of_kill']:.0f} ms")
    Console().print(table)
    Console().print({k: out[k] for k in ("engine_fault", "faults", "pool", "gateway", "open_at_end",
                                         "changed_after_close", "raised", "rss_mb")})

    counts = {k: out[k] for k in ("rollouts", "collected", "statuses", "faults", "pool",
                                  "gateway", "open_at_end", "changed_after_close",
                                  "orphan_calls", "calls_answered", "calls_recorded",
                                  "engine_fault")}

    def count(value: int) -> dict:
        return {"value": value, "baseline": out["started"],
                "ratio": round(value / out["started"], 4), "goal": 0, "unit": "rollouts",
                **counts}

    unit = ("ms per LLM call, client side, retries included; shared 2-core machine under "
            "other engineers' load: noisy")
    write_result("soak", {
        "lost": count(out["lost"]),
        "duplicated": count(out["duplicated"]),
        "rss_growth_mb": {"value": round(growth, 1),
                          "baseline": round(rss["after_warmup"][0], 1),
                          "ratio": round(growth / rss["after_warmup"][0], 4), "goal": None,
                          "unit": "MB of RSS of the gateway's process, end (engines loaded) - "
                                  "after warm-up; in-process engines (the rebuilt one too) "
                                  "included, Ray engine actors not (engine_actors_mb)",
                          "growth_over_last_half_mb": round(_last_half(rss, out["rollouts"]), 1),
                          "rss_mb": {k: round(v[0], 1) for k, v in rss.items()},
                          "engine_actors_mb": {k: round(v[1], 1) for k, v in rss.items()}},
        "llm_call_p50_ms": {"value": round(lat["p50"], 1), "baseline": None, "ratio": None,
                            "goal": None, "unit": unit, "calls": lat["calls"]},
        "llm_call_p99_ms": {"value": round(lat["p99"], 1), "baseline": round(lat["p50"], 1),
                            "ratio": round(lat["p99"] / lat["p50"], 2), "goal": None,
                            "unit": unit, "calls": lat["calls"],
                            "p99_clear_of_kill_ms": round(lat["p99_clear_of_kill"], 1),
                            "kill_window_s": lat["kill_window_s"]},
    })


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 rollouts instead of 1,000")
    parser.add_argument("--ray", action="store_true",
                        help="replicas as Ray engine actors, one SIGKILLed (default: in-process "
                             "TorchEngines, one closed)")
    args = parser.parse_args()
    main(args.quick, args.ray)
