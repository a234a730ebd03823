"""`GraphServer`: a graph (or an agent function) served over HTTP, one MLflow trace per request.

Each request runs the target once, as a rollout does (`run_chain`, or `run_agent` through a
recording gateway for an agent function), so every LLM call goes through the token chat
model and lands in the request's token ledger. The finished trajectory is answered at once and
handed to `ServedTraces`, which writes its trace in the background.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.events import jsonable
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.engines.user_engines import fit_engines
from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.rollout.agents import build_gateway, run_agent
from agentrl_sdk.rollout.graph_run import run_chain
from agentrl_sdk.serving.config import ServeConfig
from agentrl_sdk.serving.traces import ServedTraces, open_experiment
from agentrl_sdk.target import Target, is_agent_fn
from agentrl_sdk.tracing.traces import mlflow_trace_id
from agentrl_sdk.types import RolloutEvent, Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine
    from agentrl_sdk.gateway._uvicorn import InLoopServer

__all__ = ["GraphServer", "Served"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """What one request gave: the target's output, its status and the id of its trace.

    Attributes:
        request_id: The request's id (the trace's ``row_id`` tag).
        status: ``ok``, or why the run failed (``graph_error``, ``timeout``, ...).
        output: The graph's output state as JSON values (None when it failed).
        trace_id: The MLflow trace id; None when serving without traces or the trace was
            dropped (too many waiting).
        trajectory: The request's token ledger as recorded.
    """

    request_id: str
    status: TrajectoryStatus
    output: Any
    trace_id: str | None
    trajectory: Trajectory


class GraphServer:
    """Serves ``graph`` on ``config.host:config.port`` inside the caller's event loop.

    Args:
        graph: A compiled LangGraph graph, or an agent function ``agent(endpoint, input)``
            speaking OpenAI chat completions (recorded by a gateway started with the server).
        engine: The engine (or one per policy) every LLM call goes to.
        tokenizer: The policy model's tokenizer.
        config: Host, port, auth and the trace store.
        rollout: Sampling, context budget, timeouts and node rules of every request.
        model_name: Recorded on every trace as the ``model`` tag.
    """

    def __init__(
        self,
        graph: Any,
        engine: Engine | Mapping[str, Engine],
        *,
        tokenizer: Any,
        config: ServeConfig | None = None,
        rollout: RolloutConfig | None = None,
        model_name: str | None = None,
    ) -> None:
        self.target = Target.of(graph)
        if self.target.routed:
            raise TypeError("serve one graph or agent function, not a mapping of agents")
        self.agent = self.target.agents["default"]
        self.config = config or ServeConfig()
        self.rollout = rollout or RolloutConfig()
        if self.rollout.timeout_s is None:
            raise ValueError("rollout.timeout_s must be set to serve: a request may not run "
                             "without a time limit")
        self.engine = fit_engines(engine)
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tokenizer, tool_prompt=self.rollout.chat.tool_prompt)
        self.model_name = model_name or str(getattr(tokenizer, "name_or_path", "") or "")
        self.statuses: Counter[str] = Counter()
        self.traces: ServedTraces | None = None
        self._gateway = (build_gateway(self.engine, self.template, self.rollout)
                         if is_agent_fn(self.agent) else None)
        self._http: InLoopServer | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The server's root URL (``http://127.0.0.1:PORT``)."""
        if self.port is None:
            raise AgentRLError("the server is not started: await server.start() first")
        return f"http://{self.config.host}:{self.port}"

    async def invoke(self, graph_input: Any, tags: Mapping[str, str] | None = None) -> Served:
        """Run the target once on ``graph_input``; its trace is queued, never waited for."""
        request_id = uuid.uuid4().hex
        traced = self.traces is not None
        if self._gateway is not None:
            trajectory = await self._run_agent(graph_input, request_id, traced)
        else:
            trajectory = await run_chain(
                self.target, {"id": request_id}, 0, self.engine, self.template, self.rollout,
                lambda _row: graph_input, record_events=traced,
            )
        self.statuses[trajectory.status] += 1
        trace_id = None
        if self.traces is not None:
            otel_id = random.getrandbits(128)
            tags = {**(tags or {}), "request_id": request_id,
                    "mlflow.traceName": f"request {request_id[:8]}"}
            if self.model_name:
                tags["model"] = self.model_name
            if self.traces.record(trajectory, otel_id, tags):
                trace_id = mlflow_trace_id(otel_id)
        output = None
        if trajectory.status == "ok":
            output = jsonable(trajectory.final_state, None)
        return Served(request_id, trajectory.status, output, trace_id, trajectory)

    def health(self) -> dict[str, Any]:
        """``/health``: requests by status, and the trace counts (`ServedTraces.counts`)."""
        return {"status": "ok", "requests": dict(self.statuses),
                **(self.traces.counts if self.traces is not None else {})}

    async def start(self) -> GraphServer:
        """Open the trace store (one attempt: `TrackingError` when it cannot), start the
        gateway of an agent function, and listen (returns once the socket accepts)."""
        try:
            from agentrl_sdk.gateway._uvicorn import InLoopServer
            from agentrl_sdk.serving.app import create_app
        except ImportError as exc:
            raise AgentRLError(f"serving needs Starlette and uvicorn ({exc.name} is missing): "
                               "pip install 'agentrl-sdk[gateway]'") from exc
        cfg = self.config
        if cfg.tracking_uri is not None:
            experiment_id = await asyncio.to_thread(open_experiment, cfg.tracking_uri,
                                                    cfg.experiment)
            self.traces = ServedTraces(cfg.tracking_uri, experiment_id, self.tokenizer,
                                       tags=cfg.tags, max_pending=cfg.max_pending_traces)
        if self._gateway is not None:
            await self._gateway.start()
        app = create_app(self.invoke, self.health, api_key=cfg.api_key,
                         max_request_bytes=cfg.max_request_bytes)
        self._http = InLoopServer(app, cfg.host, cfg.port, "the server")
        try:
            self.port = await self._http.listen("agentrl-serve", cfg.start_timeout_s)
        except AgentRLError:
            await self.stop()  # the gateway and the trace store too
            raise
        return self

    async def stop(self, timeout_s: float = 10.0) -> dict[str, int]:
        """Stop listening (open connections are closed after ``timeout_s``), then write the
        queued traces (up to ``config.close_timeout_s``); the final trace counts."""
        if self._http is not None:
            await self._http.stop(timeout_s)
        self._http = None
        if self._gateway is not None:
            await self._gateway.stop()
        counts: dict[str, int] = {}
        if self.traces is not None:
            counts = await asyncio.to_thread(self.traces.close, self.config.close_timeout_s)
            if counts["traces_lost"] or counts["traces_dropped"]:
                logger.warning("served traces not written: %d lost, %d dropped (%d written)",
                               counts["traces_lost"], counts["traces_dropped"],
                               counts["traces_written"])
        return counts

    async def __aenter__(self) -> GraphServer:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run_agent(self, graph_input: Any, request_id: str, traced: bool) -> Trajectory:
        """One run of the agent function through the gateway, with a ``graph`` event holding
        its input and output (what the trace's root shows, and what `sdk.traces` replays)."""
        assert self._gateway is not None
        started = time.time_ns()
        trajectory = await run_agent(self.agent, graph_input, request_id, 0, self._gateway,
                                     self.rollout, record_events=traced)
        if traced:
            trajectory.events.insert(0, RolloutEvent(
                kind="graph", name="agent", id=f"agent-{request_id}", start_ns=started,
                end_ns=time.time_ns(), inputs=jsonable(graph_input, None),
                outputs=jsonable(trajectory.final_state, None),
            ))
        return trajectory
