"""`ToolSession`: the per-rollout instances of lifecycle tools, and their rewards and release."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl_sdk.tools.lifecycle import RLTool

__all__ = ["ToolSession", "current_tool_session", "tools_kwargs_of"]

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
