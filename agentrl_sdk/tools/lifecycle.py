"""verl's per-rollout tool lifecycle: the `RLTool` hooks, and the `ToolSession` that runs them."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from langchain_core.tools import BaseTool, ToolException

from agentrl_sdk.errors import AgentRLError

__all__ = ["RLTool", "ToolNotForkable", "ToolSession", "current_tool_session", "tools_kwargs_of"]


class ToolNotForkable(AgentRLError):
    """A tree rollout would branch through an `RLTool` whose state cannot be copied."""

    def __init__(self, tool: str) -> None:
        super().__init__(
            f"RLTool {tool!r} does not implement fork(instance), so a tree rollout cannot "
            "branch after it holds state: override RLTool.fork to copy the instance, or turn "
            "rollout.tree off (or branch only at rollout.tree.branch_after nodes before it)"
        )


class RLTool(BaseTool):
    """A tool with per-rollout state, for environments such as sandboxes, games or graders.

    Subclass it, declare ``name``, ``description`` and ``args_schema`` (the arguments the model
    writes) as for any LangChain tool, and implement ``execute``; override ``create``,
    ``calc_reward`` and ``release`` when the tool holds state. It binds to a chat model and
    runs in ``sdk.ToolNode`` (or LangGraph's) like any other tool.

    In a rollout, the first call creates the rollout's instance with the dataset row's
    ``extra_info.tools_kwargs.<name>.create_kwargs``; every call runs ``execute`` on it with
    the model's arguments plus the row's ``execute_kwargs``; when the rollout ends (also on
    failure) ``calc_reward`` adds the component ``tool/<name>`` to the trajectory's reward and
    ``release`` frees the instance. Outside rollouts each call gets a fresh instance that is
    released right after. An ``execute`` that exceeds ``timeout_s`` or raises becomes an error
    message the model sees (counted as ``tool_timeouts`` / ``tool_errors``).

    The tool is asynchronous: graphs that use it run with ``ainvoke`` (rollouts always do).
    """

    timeout_s: float | None = 30.0
    """Longest ``execute`` may take; None waits forever."""

    async def create(self, **create_kwargs: Any) -> Any:
        """Make the rollout's instance state (a sandbox, a game, the ground truth...)."""
        return dict(create_kwargs)

    async def execute(self, instance: Any, **arguments: Any) -> Any:
        """Run one call on ``instance``; the return value is the tool message content."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute()")

    async def calc_reward(self, instance: Any, **kwargs: Any) -> float | None:
        """The tool's reward for the finished rollout; None adds no component."""
        return None

    async def release(self, instance: Any, **kwargs: Any) -> None:
        """Free what ``create`` acquired; called exactly once per instance."""

    async def fork(self, instance: Any) -> Any:
        """A copy of ``instance`` that a tree rollout's branch goes on with (``rollout.tree``):
        what the branch does to it must not reach the original or the other branches. Each
        copy is scored and released like an instance ``create`` made.

        The default refuses (`ToolNotForkable`): only the tool knows whether its state (a
        sandbox, a game, a remote session) can be copied. Override it to return the copy,
        e.g. ``copy.deepcopy(instance)`` for plain data.
        """
        raise ToolNotForkable(self.name)

    @classmethod
    def forkable(cls) -> bool:
        """Whether the class overrides `fork`."""
        return cls.fork is not RLTool.fork

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self.name!r} is an RLTool, which is asynchronous: run the graph with ainvoke"
        )

    async def _arun(self, *args: Any, **arguments: Any) -> Any:
        arguments.pop("run_manager", None)
        session = current_tool_session.get()
        if session is None:  # outside a rollout: a one-call instance
            session = ToolSession()
            try:
                return await self._execute(session, arguments)
            finally:
                await session.close()
        return await self._execute(session, arguments)

    async def _execute(self, session: ToolSession, arguments: dict[str, Any]) -> Any:
        instance = await session.instance(self)
        call = self.execute(instance, **{**arguments, **session.kwargs(self.name, "execute")})
        try:
            return await asyncio.wait_for(call, timeout=self.timeout_s)
        except TimeoutError:
            session.metrics["tool_timeouts"] += 1
            raise ToolException(f"tool {self.name!r} timed out after {self.timeout_s} s") from None


current_tool_session: ContextVar[ToolSession | None] = ContextVar(
    "agentrl_tool_session", default=None
)
"""The session of the rollout running in this context; None outside rollouts."""


def tools_kwargs_of(row: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A row's per-tool kwargs, verl style: ``row["extra_info"]["tools_kwargs"][tool]``."""
    extra = row.get("extra_info") or {}
    kwargs = extra.get("tools_kwargs") if isinstance(extra, Mapping) else None
    return dict(kwargs or {})


class ToolSession:
    """One rollout's lifecycle-tool instances: created on first use, scored and released once.

    Each `RLTool` the rollout calls gets one instance, made by ``create(**create_kwargs)``
    with the row's kwargs for that tool; every call runs ``execute``. `close` then asks each
    instance for ``calc_reward`` (a reward component ``tool/<name>``) and always calls
    ``release``, in creation order, even when the rollout failed. Errors in ``calc_reward``
    or ``release`` are counted in `metrics`, never raised: a leaking tool must not end a run.

    Args:
        tools_kwargs: Per tool name: ``create_kwargs``, ``execute_kwargs``,
            ``calc_reward_kwargs`` and ``release_kwargs`` (each optional).
    """

    def __init__(self, tools_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.tools_kwargs = {k: dict(v or {}) for k, v in (tools_kwargs or {}).items()}
        self.metrics: Counter[str] = Counter()
        self.rewards: dict[str, float] = {}
        self._instances: dict[str, tuple[RLTool, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def kwargs(self, tool: str, phase: str) -> dict[str, Any]:
        """The row's ``<phase>_kwargs`` for ``tool`` (``create``, ``execute``, ...)."""
        return dict(self.tools_kwargs.get(tool, {}).get(f"{phase}_kwargs") or {})

    async def instance(self, tool: RLTool) -> Any:
        """The rollout's instance of ``tool``, created on first use (once, under parallel calls)."""
        if self._closed:
            raise RuntimeError(f"tool {tool.name!r} called after its rollout ended")
        lock = self._locks.setdefault(tool.name, asyncio.Lock())
        async with lock:
            if tool.name not in self._instances:
                state = await tool.create(**self.kwargs(tool.name, "create"))
                self._instances[tool.name] = (tool, state)
                self.metrics["tools_created"] += 1
        return self._instances[tool.name][1]

    async def fork(self) -> ToolSession:
        """A session for a continuation of this rollout (a tree rollout's branch), counters at
        zero: each instance is forked by its tool (`RLTool.fork`; the default refuses with
        `ToolNotForkable`). This session is then only released (`close` with ``score=False``)."""
        child = ToolSession(self.tools_kwargs)
        try:
            for name, (tool, state) in self._instances.items():
                copy = await asyncio.wait_for(tool.fork(state), timeout=tool.timeout_s)
                child._instances[name] = (tool, copy)
        except BaseException:
            await child.close(score=False)  # the copies made so far are released
            raise
        return child

    async def close(self, *, score: bool = True) -> dict[str, float]:
        """Score (unless not ``score``: a tree's inner path, which its leaves score) and
        release every instance; returns the ``tool/<name>`` reward components."""
        if self._closed:
            return self.rewards
        self._closed = True
        for name, (tool, state) in self._instances.items():
            try:
                if not score:
                    continue
                value = await tool.calc_reward(state, **self.kwargs(name, "calc_reward"))
                if value is not None:
                    if not isinstance(value, int | float) or not math.isfinite(value):
                        raise ValueError(f"calc_reward returned {value!r}, not a finite number")
                    self.rewards[f"tool/{name}"] = float(value)
            except Exception:  # noqa: BLE001 - user tool code; counted, the rollout goes on
                self.metrics["tool_reward_errors"] += 1
            finally:
                try:
                    await tool.release(state, **self.kwargs(name, "release"))
                    self.metrics["tools_released"] += 1
                except Exception:  # noqa: BLE001 - counted; other instances still get released
                    self.metrics["tool_release_errors"] += 1
        return self.rewards
