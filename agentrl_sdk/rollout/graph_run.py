"""One graph run of one rollout: the graph and input a row selects, the LangGraph config of
the run, its recorder and tools as the run's context, and the trajectory it ends as."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.turn import failure_status
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.data.sources import own_row_id
from agentrl_sdk.target import Target
from agentrl_sdk.tools import ToolSession, current_tool_session, tools_kwargs_of
from agentrl_sdk.types import RewardComponent, Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = [
    "InputFn", "default_input", "finish", "graph_run_config", "recording", "row_id_of",
    "run_chain",
]

Row = Mapping[str, Any]
InputFn = Callable[[Row], Any]


def default_input(row: Row) -> Any:
    """Graph input for a row: its ``messages`` or verl-style ``prompt``, else the row itself."""
    for key in ("messages", "prompt"):
        if key in row:
            return {"messages": list(row[key])}
    return dict(row)


def row_id_of(row: Row) -> str:
    """A row's id: its own (`own_row_id`), else a stable hash of its content."""
    if (own := own_row_id(row)) is not None:
        return own
    blob = json.dumps(row, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


async def run_chain(
    target: Target,
    row: Row,
    sample_index: int,
    engine: Engine | Mapping[str, Engine],
    template: ChatTemplate,
    config: RolloutConfig,
    input_fn: InputFn,
    record_events: bool = False,
) -> Trajectory:
    row_id = row_id_of(row)
    recorder = RolloutRecorder.for_rollout(engine, template, config, f"{row_id}:{sample_index}",
                                           record_events=record_events)
    status: TrajectoryStatus = "ok"
    error: str | None = None
    state: Any = None
    tools = ToolSession(tools_kwargs_of(row))
    try:
        with recording(recorder, tools):
            run = target.for_row(row).ainvoke(
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
