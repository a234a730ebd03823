"""Run a LangGraph graph (or an agent function) on dataset rows, many rollouts at once, and
turn each run into a `Trajectory`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.engines.user_engines import fit_engines
from agentrl_sdk.rollout.agents import build_gateway, run_agent
from agentrl_sdk.rollout.collector_gc import relaxed_gc
from agentrl_sdk.rollout.graph_run import InputFn, default_input, row_id_of, run_chain
from agentrl_sdk.rollout.tree import TreeRollouts
from agentrl_sdk.target import Target, is_agent_fn
from agentrl_sdk.types import Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["arollout", "arollout_batch", "default_input", "rollout", "row_id_of"]

Row = Mapping[str, Any]


async def arollout(
    graph: Any,
    row: Row,
    engine: Engine | Mapping[str, Engine],
    *,
    tokenizer: Any,
    n: int | None = None,
    config: RolloutConfig | None = None,
    input_fn: InputFn = default_input,
    record_events: bool = False,
) -> list[Trajectory]:
    """Run ``graph`` ``n`` times on ``row`` concurrently and return one trajectory per run.

    Args:
        graph: A compiled LangGraph graph (anything with ``ainvoke``), an agent function
            ``agent(endpoint, row)`` that speaks OpenAI chat completions to
            ``endpoint.base_url`` (see `agentrl_sdk.rollout.agents`), or a mapping of
            ``agent_name`` to either (see `Target`).
        engine: The engine, or one engine per policy name.
        tokenizer: The policy model's tokenizer (its chat template renders prompts).
        n: Samples for this row; defaults to ``config.n``.
        input_fn: Turns ``row`` into the graph's input.
        record_events: Time nodes, LLM/engine calls and tools into ``Trajectory.events``
            (what an MLflow trace is built from).
    """
    return await arollout_batch(
        graph, [row], engine, tokenizer=tokenizer, n=n, config=config, input_fn=input_fn,
        record_events=record_events,
    )


async def arollout_batch(
    graph: Any,
    rows: Iterable[Row],
    engine: Engine | Mapping[str, Engine],
    *,
    tokenizer: Any,
    n: int | None = None,
    config: RolloutConfig | None = None,
    input_fn: InputFn = default_input,
    record_events: bool = False,
) -> list[Trajectory]:
    """Rollouts of every row, ``n`` each, at most ``config.concurrency`` at once, in row order.

    ``record_events`` fills ``Trajectory.events`` (see `arollout`).
    """
    target = Target.of(graph)
    config = config or RolloutConfig()
    samples = n or config.n
    engine = fit_engines(engine)  # an object that cannot serve is refused before any rollout
    template = ChatTemplate(tokenizer, tool_prompt=config.chat.tool_prompt)
    gate = asyncio.Semaphore(config.concurrency)
    # Agent functions reach the engines through a recording gateway, up for this batch only.
    gateway = build_gateway(engine, template, config) if target.has_agent_fns else None

    async def one(row: Row, index: int) -> Trajectory:
        async with gate:
            agent_fn = _agent_fn_of(target, row) if gateway is not None else None
            if agent_fn is not None:
                return await run_agent(agent_fn, row, row_id_of(row), index, gateway, config,
                                       record_events)
            return await run_chain(
                target, row, index, engine, template, config, input_fn, record_events
            )

    if config.tree.enabled:  # rollouts forked at the graph's checkpoints: see `tree`
        trees = TreeRollouts(target, engine, template, config, input_fn, record_events, gate)
        with relaxed_gc():
            groups = await asyncio.gather(*(trees.group(row, samples) for row in rows))
        return [leaf for group in groups for leaf in group]
    jobs = [one(row, i) for row in rows for i in range(samples)]
    with relaxed_gc():  # many rollouts in flight: see `collector_gc`
        async with gateway if gateway is not None else contextlib.nullcontext():
            return list(await asyncio.gather(*jobs))


def _agent_fn_of(target: Target, row: Row) -> Any:
    """The row's agent if it is an agent function; None for a graph or an unknown agent
    (the graph path reports that one)."""
    try:
        agent = target.for_row(row)
    except KeyError:
        return None
    return agent if is_agent_fn(agent) else None


def rollout(
    graph: Any,
    row: Row,
    engine: Engine | Mapping[str, Engine],
    *,
    tokenizer: Any,
    n: int | None = None,
    config: RolloutConfig | None = None,
    input_fn: InputFn = default_input,
) -> list[Trajectory]:
    """Synchronous `arollout`, for scripts and notebooks without a running event loop."""
    return asyncio.run(
        arollout(graph, row, engine, tokenizer=tokenizer, n=n, config=config, input_fn=input_fn)
    )


