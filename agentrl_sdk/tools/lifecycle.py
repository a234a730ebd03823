"""`RLTool`: a LangChain tool with verl's per-rollout lifecycle (create, execute, reward, release)."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.tools import BaseTool, ToolException

from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.tools.session import ToolSession, current_tool_session

__all__ = ["RLTool", "ToolNotForkable"]


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
