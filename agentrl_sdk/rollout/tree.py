"""Tree rollouts (``rollout.tree``): a group's rollouts fork from the graph's own saved state.

A group of ``n`` rollouts becomes the leaves of trees. A root runs the graph from the row's
input, compiled with a checkpointer, and stops after a branch node (``interrupt_after``);
``branches`` continuations then resume from the checkpoint LangGraph saved there (its "time
travel": the saved state, not a re-run of the prefix), each with a fork of the root's recorder
(its ledger shares the trunk's segments) and of its tool session. Along a path this repeats
``depth`` times, after the first ``skip_first`` branch points a root passes (its trunk takes in
the routine steps). A path that ends before its branch point is a leaf of its own; the leaves
its tree did not make are more continuations of a sibling root's branch point (their trunk is
already generated: only the rest is to run), or, when no root of the group branched, of another
root; so a group keeps ``n`` leaves. With ``min_entropy`` set, a path branches only before an
LLM call the policy is unsure of (see `TreeConfig.min_entropy`); where it is sure, the
continuations are new roots instead.

The trunk is generated once for all its leaves, and the trainer's prefix-tree packing
(``trainer.share_prefix``) runs it once per micro-batch; ``algorithm.estimator: tree``
baselines each leaf within its tree and its sibling groups (Tree-GRPO).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode as LangGraphToolNode

from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.turn import failure_status
from agentrl_sdk.config import RolloutConfig, TreeConfig
from agentrl_sdk.rollout.graph_run import finish, graph_run_config, recording, row_id_of
from agentrl_sdk.target import Target, is_agent_fn
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
        if unknown := sorted(set(tree.branch_after) - set(nodes)):
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
    for agent in Target.of(graph).agents.values():
        if is_agent_fn(agent) or not hasattr(agent, "nodes"):
            raise ValueError("rollout.tree forks a compiled LangGraph graph at its checkpoints; "
                             f"{type(agent).__name__} is not one: turn rollout.tree off")
        branch_nodes(agent, tree)
        for spec in _specs(agent).values():
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
    passed: int = 0  # branch points gone through unbranched (``skip_first``)

    async def fork(self, child: int) -> _Path:
        """Continuation ``child``; the first carries the trunk's counters."""
        path = (*self.tree_path, child)
        recorder = self.recorder.fork(f"{self.recorder.rollout_id}.{child}",
                                      carry_counters=child == 0)  # fmt: skip
        return _Path(recorder, await self.tools.fork(), path, self.passed)

    def entropy_since(self, count: int) -> float:
        """The entropy of this path's LLM calls after its first ``count``, estimated as the
        mean surprisal (-logprob) of their sampled tokens, in nats per token (0: none)."""
        logprobs = [lp for call in self.recorder.ledger.calls[count:]
                    for lp in call.response_logprobs]  # fmt: skip
        return -statistics.fmean(logprobs) if logprobs else 0.0


@dataclass(frozen=True)
class _Ending:
    """How a graph run stopped: finished or failed (``paused_at`` None), or paused at a branch
    point, whose checkpoint config the continuations resume from."""

    status: TrajectoryStatus
    error: str | None
    state: Any
    paused_at: dict[str, Any] | None


@dataclass
class _BranchPoint:
    """A root paused at its first branch point, kept until its group ends so that short trees
    fork more continuations from it; ``children``: continuations forked so far."""

    path: _Path
    ending: _Ending
    children: int


@dataclass
class _Group:
    """What the trees of one row's group share: the row, its graph (with a checkpointer) and
    branch nodes, the indices of the further roots it starts, the first roots still running to
    their first branch point (``unsettled``), the branch points they reached, and the threads
    to delete when the group ends."""

    row: Row
    row_id: str
    graph: Any
    nodes: list[str]
    roots: Iterator[int]
    unsettled: set[int]
    points: list[_BranchPoint] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def settle(self, path: _Path, point: _BranchPoint | None = None) -> None:
        """``path`` ran to its first branch point (``point``, when it branched there) or ended."""
        async with self.changed:
            if point is not None:
                self.points.append(point)
            if len(path.tree_path) == 1:
                self.unsettled.discard(path.tree_path[0])
            self.changed.notify_all()

    async def branch_point(self) -> _BranchPoint | None:
        """The branch point with the fewest continuations once one exists; None once every
        first root ended without one."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.points or not self.unsettled)
        return min(self.points, key=lambda p: p.children, default=None)


class TreeRollouts:
    """The tree rollouts of one `arollout_batch` call (see the module docstring).
    ``record_events`` traces the paths (a leaf's events: its trunk's, then its own); ``gate``
    bounds the graph runs (roots and continuations) going at once."""

    def __init__(
        self,
        target: Target,
        engines: Engine | Mapping[str, Engine],
        template: ChatTemplate,
        config: RolloutConfig,
        input_fn: Callable[[Row], Any],
        record_events: bool,
        gate: asyncio.Semaphore,
    ) -> None:
        check_forkable(target, config.tree)
        self.target, self.engines, self.template = target, engines, template
        self.config, self.tree = config, config.tree
        self.input_fn, self.record_events, self.gate = input_fn, record_events, gate
        self._forkable: dict[int, tuple[Any, list[str]]] = {}
        self._saver = InMemorySaver()

    async def group(self, row: Row, n: int) -> list[Trajectory]:
        """The ``n`` leaves of ``row``'s trees, ordered by their tree paths (sample indices)."""
        shares = self._shares(n, depth=-1)  # one per root
        graph, nodes = self._graph(row)
        group = _Group(row, row_id_of(row), graph, nodes, itertools.count(len(shares)),
                       set(range(len(shares))))  # fmt: skip
        try:
            trees = await asyncio.gather(*(self._tree(group, i, share)
                                           for i, share in enumerate(shares)))  # fmt: skip
        finally:  # the branch points' trunks: their continuations score and release copies
            for point in group.points:
                await point.path.tools.close(score=False)
            if graph.checkpointer is self._saver:  # a user's checkpointer keeps its own
                for thread in group.threads:
                    await self._saver.adelete_thread(thread)
        leaves = sorted(itertools.chain(*trees), key=lambda t: t.tree_path or [])
        for index, leaf in enumerate(leaves):
            leaf.sample_index = index
        return leaves

    async def _tree(self, group: _Group, index: int, leaves: int, depth: int = 0,
                    ) -> list[Trajectory]:  # fmt: skip
        """Tree ``index``'s leaves, grown from ``depth`` (its root's place among the branch
        points); if its paths ended early, the rest come from a sibling's branch point."""
        recorder = RolloutRecorder.for_rollout(self.engines, self.template, self.config,
                                               f"{group.row_id}:t{index}",
                                               record_events=self.record_events)  # fmt: skip
        root = _Path(recorder, ToolSession(tools_kwargs_of(group.row)), (index,))
        run_config = graph_run_config(self.config, recorder)
        group.threads.append(run_config["configurable"]["thread_id"])
        try:
            made = await self._grow(group, root, self.input_fn(group.row), run_config, depth,
                                    leaves)  # fmt: skip
        finally:
            await group.settle(root)  # ended (or failed) before its branch point, if not yet
        if len(made) < leaves:
            made += await self._rest(group, leaves - len(made), depth)
        return made

    async def _rest(self, group: _Group, leaves: int, depth: int) -> list[Trajectory]:
        """``leaves`` more leaves for a tree that came up short: continuations of the group's
        least used branch point, so only what follows it is run (a root run from the start
        after the short path would double the group's time); another root if none branched
        (or its tools cannot be forked again)."""
        # An entropy-gated tree keeps none (its roots settle only when their trees end).
        point = None if self.tree.min_entropy is not None else await group.branch_point()
        if point is None:
            return await self._tree(group, next(group.roots), leaves, depth)
        shares = self._shares(leaves, depth=0)
        first, point.children = point.children, point.children + len(shares)
        children: list[_Path] = []
        try:
            for child in range(first, first + len(shares)):
                children.append(await point.path.fork(child))
        except Exception:  # noqa: BLE001 - a user's RLTool.fork: this point is spent
            for made in children:
                await made.tools.close(score=False)
            return await self._tree(group, next(group.roots), leaves, depth)
        grown = await asyncio.gather(*(self._go_on(group, child, point.ending, 1, share)
                                       for child, share in zip(children, shares, strict=True)))
        return list(itertools.chain(*grown))

    async def _grow(
        self, group: _Group, path: _Path, graph_input: Any, run_config: dict[str, Any],
        depth: int, leaves: int,
    ) -> list[Trajectory]:
        """Run ``path`` on until it ends or pauses at a branch point; fork it there into the
        continuations that make at most ``leaves`` leaves."""
        branching = depth < self.tree.depth and leaves > 1
        async with self.gate:
            ending = await self._run(group.graph, path, graph_input, run_config,
                                     group.nodes if branching else None)  # fmt: skip
        if ending.paused_at is None:
            await group.settle(path)
            return [await self._leaf(group.row_id, path, ending)]
        if path.passed < self.tree.skip_first:  # a routine step: the trunk goes on through it
            path.passed += 1
            return await self._go_on(group, path, ending, depth, leaves)
        shares = self._shares(leaves, depth)
        if self.tree.min_entropy is not None:
            return await self._branch_if_unsure(group, path, ending, depth, shares)
        return await self._branch(group, path, ending, depth, shares)

    def _shares(self, leaves: int, depth: int) -> list[int]:
        """How ``leaves`` split among the continuations of a branch point at ``depth`` (-1: among
        a group's roots): a full subtree's leaves each, the last one the rest."""
        per_child = self.tree.branches ** (self.tree.depth - depth - 1)
        return [min(per_child, leaves - c * per_child)
                for c in range(math.ceil(leaves / per_child))]  # fmt: skip

    async def _branch(
        self, group: _Group, path: _Path, ending: _Ending, depth: int, shares: list[int],
        first: tuple[_Path, _Ending] | None = None,
    ) -> list[Trajectory]:
        """Fork ``path`` at its branch point into one continuation per share of leaves (the
        first is ``first``'s path, gone on from there already, when given)."""
        children = [] if first is None else [first[0]]
        try:
            while len(children) < len(shares):
                children.append(await path.fork(len(children)))
        except Exception as exc:  # noqa: BLE001 - a user's RLTool.fork refused, failed or hung
            if first is None:
                return [await self._fork_failed(group.row_id, path, children, exc)]
            # The probe carries the trunk's counters and its own call: it is the error leaf.
            await path.tools.close(score=False)
            return [await self._fork_failed(group.row_id, first[0], children[1:], exc)]
        if first is None:
            children[0].tools.metrics.update(path.tools.metrics)  # the trunk's, counted once
        if first is None and depth == 0 and len(path.tree_path) == 1:
            # A root's first branch point: kept open for the group's short trees (`_rest`).
            await group.settle(path, _BranchPoint(path, ending, len(children)))
        else:
            await path.tools.close(score=False)  # each continuation scores and releases its copy
        grown = await asyncio.gather(*(
            self._go_on(group, child, first[1] if first and c == 0 else ending, depth + 1, share)
            for c, (child, share) in enumerate(zip(children, shares, strict=True))
        ))  # fmt: skip
        return list(itertools.chain(*grown))

    async def _go_on(self, group: _Group, path: _Path, ending: _Ending, depth: int,
                     leaves: int) -> list[Trajectory]:  # fmt: skip
        """``path`` on from where ``ending`` left it: a leaf if it ended, else grown on from
        its checkpoint."""
        if ending.paused_at is None:
            return [await self._leaf(group.row_id, path, ending)]
        return await self._grow(group, path, None, self._resume_config(ending, path), depth,
                                leaves)  # fmt: skip

    async def _branch_if_unsure(
        self, group: _Group, path: _Path, ending: _Ending, depth: int, shares: list[int],
    ) -> list[Trajectory]:
        """``rollout.tree.min_entropy``: continuation 0 makes its next LLM call first; the
        other continuations sample that call again from the branch point if it was unsure,
        else they are new roots (the policy was sure here: the variance is earlier)."""
        try:
            probe = await path.fork(0)
        except Exception as exc:  # noqa: BLE001 - a user's RLTool.fork refused, failed or hung
            return [await self._fork_failed(group.row_id, path, [], exc)]
        probe.tools.metrics.update(path.tools.metrics)  # the trunk's, counted once
        calls = len(path.recorder.ledger.calls)
        ahead = await self._look_ahead(group.graph, probe, ending, calls)
        called = len(probe.recorder.ledger.calls) > calls
        if called and probe.entropy_since(calls) >= (self.tree.min_entropy or 0.0):
            return await self._branch(group, path, ending, depth, shares, first=(probe, ahead))
        await path.tools.close(score=False)
        probe.tree_path = path.tree_path  # no branch: this path going on
        probe.recorder.metrics["tree_branch_declined"] += int(called)
        # If it ended, it is a leaf, and its share's rest comes from its tree.
        grown = await asyncio.gather(self._go_on(group, probe, ahead, depth + 1, shares[0]), *(
            self._tree(group, next(group.roots), share, depth + 1) for share in shares[1:]))
        return list(itertools.chain(*grown))

    async def _look_ahead(self, graph: Any, probe: _Path, ending: _Ending, calls: int,
                          ) -> _Ending:  # fmt: skip
        """Run ``probe`` (continuation 0, whose trunk made ``calls`` LLM calls) on from the
        branch point through its next LLM call, pausing after every node until one made a
        call, or to its end; all of it within one ``rollout.timeout_s``."""
        every = [name for name in graph.nodes if not name.startswith("__")]
        run_config = self._resume_config(ending, probe)
        limit = self.config.timeout_s
        deadline = None if limit is None else asyncio.get_running_loop().time() + limit
        for _ in range(self.config.recursion_limit):  # resumed runs do not count steps
            async with self.gate:
                ahead = await self._run(graph, probe, None, run_config, every, deadline)
            if ahead.paused_at is None or len(probe.recorder.ledger.calls) > calls:
                return ahead
            run_config = self._resume_config(ahead, probe)
        async with self.gate:  # no call in as many steps: on to the end (or its step limit)
            return await self._run(graph, probe, None, run_config, None, deadline)

    async def _fork_failed(self, row_id: str, path: _Path, children: list[_Path],
                           exc: Exception) -> Trajectory:
        """``path`` as an error leaf: a fork refused, failed or hung; the copies made so far
        are released unscored."""
        for child in children:
            await child.tools.close(score=False)
        path.recorder.metrics["tree_fork_failed"] += 1
        error = str(exc) if isinstance(exc, ToolNotForkable) else f"fork failed: {exc!r}"
        return await self._leaf(row_id, path, _Ending("graph_error", error, None, None))

    async def _run(
        self, graph: Any, path: _Path, graph_input: Any, run_config: dict[str, Any],
        interrupt_after: list[str] | None, deadline: float | None = None,
    ) -> _Ending:
        """One graph run of ``path``, within ``rollout.timeout_s`` or until the event loop's
        ``deadline``; its last checkpoint tells whether it paused."""
        timeout = self.config.timeout_s
        if deadline is not None:
            timeout = max(0.0, deadline - asyncio.get_running_loop().time())
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
                await asyncio.wait_for(consume(), timeout=timeout)
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
        graph = self.target.for_row(row)
        if id(graph) not in self._forkable:
            forkable = graph if isinstance(graph.checkpointer, BaseCheckpointSaver) else (
                graph.copy(update={"checkpointer": self._saver}))
            self._forkable[id(graph)] = (forkable, branch_nodes(graph, self.tree))
        return self._forkable[id(graph)]
