"""Run a LangGraph graph on dataset rows and turn each run into a `Trajectory`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.chat.events import EventLog
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.user_engines import fit_engines
from agentrl_sdk.chat.turn import failure_status
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.data.sources import own_row_id
from agentrl_sdk.rollout.agents import build_gateway, is_agent_fn, run_agent, uses_agent_fns
from agentrl_sdk.rollout.collector_gc import relaxed_gc
from agentrl_sdk.tools import ToolSession, current_tool_session, tools_kwargs_of
from agentrl_sdk.types import RewardComponent, Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

Row = Mapping[str, Any]
InputFn = Callable[[Row], Any]


def default_input(row: Row) -> Any:
    """Graph input for a row: its ``messages`` or verl-style ``prompt``, else the row itself."""
    if "messages" in row:
        return {"messages": list(row["messages"])}
    if "prompt" in row:
        return {"messages": list(row["prompt"])}
    return dict(row)


def select_graph(graph: Any, row: Row) -> Any:
    """The graph for ``row``: ``graph`` itself, or ``graph[row["agent_name"]]`` from a mapping.

    A mapping of agent names to graphs routes each row the way verl's ``agent_name`` selects
    an agent loop; rows without ``agent_name`` use the ``"default"`` entry.

    Raises:
        KeyError: The mapping has no graph for the row's agent.
    """
    if not isinstance(graph, Mapping):
        return graph
    name = row.get("agent_name") or "default"
    if name not in graph:
        raise KeyError(f"no graph for agent_name {name!r} (known: {', '.join(sorted(graph))})")
    return graph[name]


def row_id_of(row: Row) -> str:
    """A row's id: its own (`own_row_id`), else a stable hash of its content."""
    own = own_row_id(row)
    if own is not None:
        return own
    blob = json.dumps(row, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


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
            ``agent_name`` to either (see `select_graph`).
        row: The dataset row; ``input_fn`` turns it into the graph's input.
        engine: The engine, or one engine per policy name.
        tokenizer: The policy model's tokenizer (its chat template renders prompts).
        n: Samples for this row; defaults to ``config.n``.
        config: Rollout configuration.
        input_fn: Row to graph input.
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
    config = config or RolloutConfig()
    samples = n or config.n
    engine = fit_engines(engine)  # an object that cannot serve is refused before any rollout
    template = ChatTemplate(tokenizer, tool_prompt=config.chat.tool_prompt)
    gate = asyncio.Semaphore(config.concurrency)
    # Agent functions reach the engines through a recording gateway, up for this batch only.
    gateway = build_gateway(engine, template, config) if uses_agent_fns(graph) else None

    async def one(row: Row, index: int) -> Trajectory:
        async with gate:
            target = _agent_fn_of(graph, row) if gateway is not None else None
            if target is not None:
                return await run_agent(target, row, row_id_of(row), index, gateway, config,
                                       record_events)
            return await _run_one(
                graph, row, index, engine, template, config, input_fn, record_events
            )

    if config.tree.enabled:  # rollouts forked at the graph's checkpoints: see `tree`
        from agentrl_sdk.rollout.tree import TreeRollouts  # it builds on this module

        trees = TreeRollouts(graph, engine, template, config, input_fn, record_events, gate)
        with relaxed_gc():
            groups = await asyncio.gather(*(trees.group(row, samples) for row in rows))
        return [leaf for group in groups for leaf in group]
    jobs = [one(row, i) for row in rows for i in range(samples)]
    with relaxed_gc():  # many rollouts in flight: see `collector_gc`
        if gateway is None:
            return list(await asyncio.gather(*jobs))
        async with gateway:
            return list(await asyncio.gather(*jobs))


def _agent_fn_of(graph: Any, row: Row) -> Any:
    """The row's target if it is an agent function; None for a graph or an unknown agent
    (the graph path reports that one)."""
    try:
        target = select_graph(graph, row)
    except KeyError:
        return None
    return target if is_agent_fn(target) else None


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


async def _run_one(
    graph: Any,
    row: Row,
    sample_index: int,
    engine: Engine | Mapping[str, Engine],
    template: ChatTemplate,
    config: RolloutConfig,
    input_fn: InputFn,
    record_events: bool = False,
) -> Trajectory:
    row_id = row_id_of(row)
    events = EventLog() if record_events else None
    recorder = RolloutRecorder(
        engine,
        template,
        chat=config.chat,
        sampling=config.sampling,
        rollout_id=f"{row_id}:{sample_index}",
        default_trainable=config.default_trainable,
        node_rules=config.nodes,
        events=events,
    )
    status: TrajectoryStatus = "ok"
    error: str | None = None
    state: Any = None
    tools = ToolSession(tools_kwargs_of(row))
    try:
        with recording(recorder, tools):
            run = select_graph(graph, row).ainvoke(
                input_fn(row), config=graph_run_config(config, recorder)
            )
            state = await asyncio.wait_for(run, timeout=config.timeout_s)
    except Exception as exc:  # noqa: BLE001 - a user graph may raise anything; it is recorded
        status, error = failure_status(exc, config.timeout_s)
    finally:
        finished = await finish(recorder, tools, row_id, sample_index, status, error, state)
    return finished


@contextlib.contextmanager
def recording(recorder: RolloutRecorder, tools: ToolSession) -> Iterator[None]:
    """Route the LLM calls and lifecycle tools of the graph run inside to ``recorder`` and
    ``tools`` (context variables: each asyncio task sees its own)."""
    token = current_recorder.set(recorder)
    tools_token = current_tool_session.set(tools)
    try:
        yield
    finally:
        current_tool_session.reset(tools_token)
        current_recorder.reset(token)


def graph_run_config(config: RolloutConfig, recorder: RolloutRecorder) -> dict[str, Any]:
    """The LangGraph config of one rollout's graph run: the step limit, the user's
    ``configurable`` with a fresh thread, the recorder's event log as callback."""
    run_config: dict[str, Any] = {
        "recursion_limit": config.recursion_limit,
        # A checkpointer keys state by thread: one fresh thread per rollout.
        "configurable": {**config.configurable, "thread_id": f"{recorder.rollout_id}:"
                         f"{uuid.uuid4().hex[:12]}"},
    }  # fmt: skip
    if recorder.events is not None:
        run_config["callbacks"] = [recorder.events]
    return run_config


async def finish(
    recorder: RolloutRecorder, tools: ToolSession, row_id: str, sample_index: int,
    status: TrajectoryStatus, error: str | None, state: Any,
) -> Trajectory:
    """The trajectory of a finished rollout; its lifecycle tools are scored and released
    whatever happened to it."""
    recorder.components += [RewardComponent(name=name, value=value)
                            for name, value in (await tools.close()).items()]  # fmt: skip
    recorder.metrics.update(tools.metrics)
    return recorder.trajectory(row_id, sample_index, status, error, final_state=state)
