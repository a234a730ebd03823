"""Tree rollouts (``rollout.tree``): a group's rollouts fork from the graph's own saved state.

A group of ``n`` rollouts becomes the leaves of trees. A root runs the graph from the row's
input, compiled with a checkpointer, and stops after a branch node (``interrupt_after``);
``branches`` continuations then resume from the checkpoint LangGraph saved there (its "time
travel": the saved state, not a re-run of the prefix), each with a fork of the root's recorder
(its ledger shares the trunk's segments) and of its tool session. Along a path this repeats
``depth`` times. A path that ends before its branch point is a leaf of its own; the leaves its
tree did not make come from another root, so a group keeps ``n`` leaves.

The trunk is generated once for all its leaves, and the trainer's prefix-tree packing
(``trainer.share_prefix``) runs it once per micro-batch; ``algorithm.estimator: tree``
baselines each leaf within its tree and its sibling groups (Tree-GRPO).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode as LangGraphToolNode

from agentrl_sdk.chat.events import EventLog
from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.turn import failure_status
from agentrl_sdk.config import RolloutConfig, TreeConfig
from agentrl_sdk.rollout.agents import is_agent_fn
from agentrl_sdk.rollout.runner import (
    finish,
    graph_run_config,
    recording,
    row_id_of,
    select_graph,
)
from agentrl_sdk.tools import RLTool, ToolNotForkable, ToolSession, tools_kwargs_of
from agentrl_sdk.types import Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["TreeRollouts", "branch_nodes", "check_forkable"]

Row = Mapping[str, Any]


def branch_nodes(graph: Any, tree: TreeConfig) -> list[str]:
    """The top-level nodes of ``graph`` a path may branch after (see ``TreeConfig``).

    Raises:
        ValueError: A named node is not in the graph, or the graph has no tool node.
    """
    nodes = [name for name in graph.nodes if not name.startswith("__")]
    if tree.branch_after is not None:
        unknown = sorted(set(tree.branch_after) - set(nodes))
        if unknown:
            raise ValueError(f"rollout.tree.branch_after names {unknown}, which the graph does "
                             f"not have (its nodes: {nodes})")
        return list(tree.branch_after)
    tools = [name for name, spec in _specs(graph).items()
             if isinstance(spec.runnable, LangGraphToolNode)]  # fmt: skip
    if not tools:
        raise ValueError(f"rollout.tree found no tool node to branch after in the graph (its "
                         f"nodes: {nodes}): set rollout.tree.branch_after")
    return tools


def check_forkable(graph: Any, tree: TreeConfig) -> None:
    """Refuse, before any rollout, a graph that tree rollouts cannot fork: an agent function
    (no LangGraph state to resume), or an `RLTool` without `RLTool.fork` in a tool node.

    Raises:
        ValueError: Why, and what to change.
    """
    if not tree.enabled:
        return
    for target in graph.values() if isinstance(graph, Mapping) else [graph]:
        if is_agent_fn(target) or not hasattr(target, "nodes"):
            raise ValueError("rollout.tree forks a compiled LangGraph graph at its checkpoints; "
                             f"{type(target).__name__} is not one: turn rollout.tree off")
        branch_nodes(target, tree)
        for spec in _specs(target).values():
            for tool in getattr(spec.runnable, "tools_by_name", {}).values():
                if isinstance(tool, RLTool) and not tool.forkable():
                    raise ValueError(str(ToolNotForkable(tool.name)))


def _specs(graph: Any) -> dict[str, Any]:
    builder = getattr(graph, "builder", None)
    return dict(getattr(builder, "nodes", {}))


@dataclass
class _Path:
    """One path of a tree so far: its recorder and tools, and where it is in the tree."""

    recorder: RolloutRecorder
    tools: ToolSession
    tree_path: tuple[int, ...]

    async def fork(self, child: int) -> _Path:
        """Continuation ``child``; the first carries the trunk's counters."""
        path = (*self.tree_path, child)
        recorder = self.recorder.fork(f"{self.recorder.rollout_id}.{child}",
                                      carry_counters=child == 0)  # fmt: skip
        return _Path(recorder, await self.tools.fork(), path)


@dataclass(frozen=True)
class _Ending:
    """How a graph run stopped: finished or failed (``paused_at`` None), or paused at a branch
    point, whose checkpoint config the continuations resume from."""

    status: TrajectoryStatus
    error: str | None
    state: Any
    paused_at: dict[str, Any] | None


class TreeRollouts:
    """The tree rollouts of one `arollout_batch` call (see the module docstring).

    Args:
        graph: The compiled graph, or a mapping of agent names to graphs (`select_graph`).
        engines: The engine serving each policy (or one engine).
        template: The policy model's chat template.
        config: The rollout settings; ``config.tree`` shapes the trees.
        input_fn: Row to graph input.
        record_events: Trace the paths (a leaf's events: its trunk's, then its own).
        gate: Bounds the graph runs (roots and continuations) going at once.
    """

    def __init__(
        self,
        graph: Any,
        engines: Engine | Mapping[str, Engine],
        template: ChatTemplate,
        config: RolloutConfig,
        input_fn: Callable[[Row], Any],
        record_events: bool,
        gate: asyncio.Semaphore,
    ) -> None:
        check_forkable(graph, config.tree)
        self.graph, self.engines, self.template = graph, engines, template
        self.config, self.tree = config, config.tree
        self.input_fn, self.record_events, self.gate = input_fn, record_events, gate
        self._forkable: dict[int, tuple[Any, list[str]]] = {}
        self._saver = InMemorySaver()

    async def group(self, row: Row, n: int) -> list[Trajectory]:
        """The ``n`` leaves of ``row``'s trees, ordered by their tree paths (sample indices)."""
        per_root = self.tree.branches**self.tree.depth
        roots = math.ceil(n / per_root)
        trees = await asyncio.gather(*(self._tree(row, i, roots, min(per_root, n - i * per_root))
                                       for i in range(roots)))  # fmt: skip
        leaves = sorted(itertools.chain(*trees), key=lambda t: t.tree_path or [])
        for index, leaf in enumerate(leaves):
            leaf.sample_index = index
        return leaves

    async def _tree(self, row: Row, index: int, roots: int, leaves: int) -> list[Trajectory]:
        """Tree ``index``'s leaves; if its paths ended early, the rest come from tree
        ``index + roots``, and so on (each tree makes at least one)."""
        graph, nodes = self._graph(row)
        row_id = row_id_of(row)
        recorder = RolloutRecorder(
            self.engines, self.template, chat=self.config.chat, sampling=self.config.sampling,
            rollout_id=f"{row_id}:t{index}", default_trainable=self.config.default_trainable,
            node_rules=self.config.nodes, events=EventLog() if self.record_events else None,
        )  # fmt: skip
        root = _Path(recorder, ToolSession(tools_kwargs_of(row)), (index,))
        run_config = graph_run_config(self.config, recorder)
        try:
            made = await self._grow(graph, nodes, row_id, root, self.input_fn(row), run_config,
                                    0, leaves)  # fmt: skip
        finally:
            if graph.checkpointer is self._saver:  # a user's checkpointer keeps its threads
                await self._saver.adelete_thread(run_config["configurable"]["thread_id"])
        if len(made) < leaves:
            made += await self._tree(row, index + roots, roots, leaves - len(made))
        return made

    async def _grow(
        self, graph: Any, nodes: list[str], row_id: str, path: _Path, graph_input: Any,
        run_config: dict[str, Any], depth: int, leaves: int,
    ) -> list[Trajectory]:
        """Run ``path`` on until it ends or pauses at a branch point; fork it there into the
        continuations that make at most ``leaves`` leaves."""
        branching = depth < self.tree.depth and leaves > 1
        async with self.gate:
            ending = await self._run(graph, path, graph_input, run_config,
                                     nodes if branching else None)  # fmt: skip
        if ending.paused_at is None:
            return [await self._leaf(row_id, path, ending)]
        per_child = self.tree.branches ** (self.tree.depth - depth - 1)
        shares = [min(per_child, leaves - c * per_child)
                  for c in range(math.ceil(leaves / per_child))]  # fmt: skip
        children: list[_Path] = []
        try:
            for c in range(len(shares)):
                children.append(await path.fork(c))
        except Exception as exc:  # noqa: BLE001 - a user's RLTool.fork refused, failed or hung
            for child in children:
                await child.tools.close(score=False)
            path.recorder.metrics["tree_fork_failed"] += 1
            error = str(exc) if isinstance(exc, ToolNotForkable) else f"fork failed: {exc!r}"
            return [await self._leaf(row_id, path, _Ending("graph_error", error, None, None))]
        await path.tools.close(score=False)  # each continuation scores and releases its copy
        children[0].tools.metrics.update(path.tools.metrics)  # the trunk's, counted once
        grown = await asyncio.gather(*(
            self._grow(graph, nodes, row_id, child, None, self._resume_config(ending, child),
                       depth + 1, share)
            for child, share in zip(children, shares, strict=True)
        ))  # fmt: skip
        return list(itertools.chain(*grown))

    async def _run(
        self, graph: Any, path: _Path, graph_input: Any, run_config: dict[str, Any],
        interrupt_after: list[str] | None,
    ) -> _Ending:
        """One graph run of ``path``; its last checkpoint tells whether it paused."""
        values: Any = None
        checkpoint: dict[str, Any] | None = None

        async def consume() -> None:
            nonlocal values, checkpoint
            async for mode, data in graph.astream(
                graph_input, run_config, stream_mode=["values", "checkpoints"],
                interrupt_after=interrupt_after,
            ):  # fmt: skip
                if mode == "values":
                    values = data
                else:
                    checkpoint = data

        try:
            with recording(path.recorder, path.tools):
                await asyncio.wait_for(consume(), timeout=self.config.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a user graph may raise anything; it is recorded
            status, error = failure_status(exc, self.config.timeout_s)
            return _Ending(status, error, values, None)
        paused = interrupt_after is not None and checkpoint is not None and checkpoint["next"]
        return _Ending("ok", None, values, checkpoint["config"] if paused else None)

    def _resume_config(self, ending: _Ending, child: _Path) -> dict[str, Any]:
        """The config that resumes a continuation from the branch point's checkpoint."""
        assert ending.paused_at is not None
        config = graph_run_config(self.config, child.recorder)
        config["configurable"] = {**config["configurable"], **ending.paused_at["configurable"]}
        return config

    async def _leaf(self, row_id: str, path: _Path, ending: _Ending) -> Trajectory:
        trajectory = await finish(path.recorder, path.tools, row_id, 0, ending.status,
                                  ending.error, ending.state)  # fmt: skip
        trajectory.tree_path = list(path.tree_path)
        return trajectory

    def _graph(self, row: Row) -> tuple[Any, list[str]]:
        """``row``'s graph with a checkpointer (its own, else this batch's in-memory one),
        and its branch nodes."""
        graph = select_graph(self.graph, row)
        if id(graph) not in self._forkable:
            forkable = graph if isinstance(graph.checkpointer, BaseCheckpointSaver) else (
                graph.copy(update={"checkpointer": self._saver}))
            self._forkable[id(graph)] = (forkable, branch_nodes(graph, self.tree))
        return self._forkable[id(graph)]
