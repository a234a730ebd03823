"""Traces of tree rollouts: what each node of a tree earned, and one trace drawing a whole tree.

A tree rollout's leaves are traced one by one like chains (`traces.build_trace_payload`), each
tagged with its ``tree_path`` and carrying `tree_credit`, the credit of every node on its path.
`build_tree_payloads` adds one trace per tree: a span per node of the tree (the tree itself,
each continuation, each leaf), nested as the tree branched, with the LLM calls generated on
that edge (once, however many leaves share them), the node's leaves, mean reward and credit,
and on each leaf its reward, advantage and the id of its own trace.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentrl_sdk.tracing.traces import (
    RolloutCredit,
    SpanBuilder,
    TraceKind,
    TracePayload,
    attributes,
    decode_ids,
    now_pair,
    trace_info,
)
from agentrl_sdk.types import LLMCall, Trajectory

__all__ = ["build_tree_payloads", "tree_credit"]

LeafKey = tuple[str, int]
"""A leaf's ``(row_id, sample_index)``."""

_TREE: TraceKind = "tree"


def tree_credit(trajectories: Iterable[Trajectory]) -> dict[LeafKey, list[dict]]:
    """Per tree-rollout leaf (``(row_id, sample_index)``), the nodes of its path from its tree
    down to itself: each node's leaves and their mean reward, and its credit, that mean minus
    its parent's (the group's, for a tree): what the choice made there earned, step by step."""
    out: dict[LeafKey, list[dict]] = {}
    for leaves in _groups(trajectories).values():
        for leaf in leaves:
            nodes, above = [], _mean_reward(leaves)
            for depth in range(1, len(leaf.tree_path or []) + 1):
                under = _under(leaves, leaf.tree_path[:depth])
                mean = _mean_reward(under)
                nodes.append({"node": _name(leaf.tree_path[:depth]), "leaves": len(under),
                              "mean_reward": mean, "credit": mean - above})
                above = mean
            out[(leaf.row_id, leaf.sample_index)] = nodes
    return out


def build_tree_payloads(
    trajectories: Sequence[Trajectory],
    traced: Mapping[LeafKey, str],
    *,
    experiment_id: str,
    step: int,
    run_id: str | None = None,
    credit: Mapping[LeafKey, RolloutCredit] | None = None,
    tokenizer: Any = None,
    phase: str = "train",
) -> list[TracePayload]:
    """One trace per tree that has a traced leaf.

    Args:
        trajectories: The step's rollouts (chains are skipped); a tree's leaves all of them.
        traced: The trace id of each leaf traced on its own: the trees drawn, and the links.
        experiment_id, step, run_id, tokenizer, phase: As in `build_trace_payload`.
        credit: Advantage and loss share per leaf.
    """
    paths = {(t.row_id, t.sample_index): t.tree_path for t in trajectories if t.tree_path}
    wanted = {(key[0], paths[key][0]) for key in traced if key in paths}
    payloads = []
    for row_id, leaves in _groups(trajectories).items():
        for tree in sorted({leaf.tree_path[0] for leaf in leaves}):
            if (row_id, tree) in wanted:
                drawing = _TreeDrawing(leaves, traced, credit or {}, tokenizer)
                payloads.append(drawing.payload(row_id, tree, experiment_id, step, run_id,
                                                phase))  # fmt: skip
    return payloads


class _TreeDrawing:
    """The spans of one row's trees: a node's calls are those all its leaves share (by
    identity: forked ledgers hold their trunk's calls themselves) beyond its parent's."""

    def __init__(self, leaves: list[Trajectory], traced: Mapping[LeafKey, str],
                 credit: Mapping[LeafKey, RolloutCredit], tokenizer: Any) -> None:
        self.leaves, self.traced, self.credit, self.tokenizer = leaves, traced, credit, tokenizer
        self.group_mean = _mean_reward(leaves)
        self.builder = SpanBuilder(random.getrandbits(128))

    def payload(self, row_id: str, tree: int, experiment_id: str, step: int,
                run_id: str | None, phase: str) -> TracePayload:
        under = _under(self.leaves, [tree])
        start, end = _span_of(under)
        inputs = {"row_id": row_id, "tree": tree, "step": step}
        ok = all(leaf.status == "ok" for leaf in under)
        status = "ok" if ok else "error"
        about = {"row_id": row_id, "step": step, "status": status}  # what `TraceView` reads
        root = self._node(None, [tree], under, self.group_mean, 0, start, inputs, about)
        tags = {"step": str(step), "phase": phase, "row_id": row_id, "kind": _TREE,
                "status": status, "tree_path": str(tree), "tree_leaves": str(len(under)),
                "mlflow.traceName": f"tree {row_id} · {tree}"}
        if run_id:
            tags["run_id"] = run_id
        outputs = self.builder.spans[root - 1]["attributes"]["mlflow.spanOutputs"]
        return trace_info(self.builder, experiment_id, start, end, ok, inputs, outputs, run_id,
                          tags), self.builder.spans

    def _node(self, parent: int | None, path: list[int], under: list[Trajectory], above: float,
              calls_above: int, start: int, inputs: Any = None,
              about: dict[str, Any] | None = None) -> int:
        """The span of node ``path`` (under span ``parent``; ``under``: its leaves) and,
        beneath it, its calls and its children's spans."""
        shared = _shared_calls(under)
        mean = _mean_reward(under)
        first = under[0]
        own = list(range(calls_above, len(shared)))
        times = [_call_time(first, i) for i in own]
        start = min([t[0] for t in times if t] or [start])
        end = max(start, _span_of(under)[1])
        outputs: dict[str, Any] = {"leaves": len(under), "mean_reward": mean,
                                   "credit": mean - above,
                                   "generated": [decode_ids(self.tokenizer, shared[i].response_ids)
                                                 for i in own]}  # fmt: skip
        attrs = attributes(kind="tree_node", tree_node=_name(path), leaves=len(under),
                           mean_reward=mean, credit=mean - above,
                           generated_tokens=sum(len(shared[i].response_ids) for i in own),
                           **(about or {}))
        is_leaf = len(under) == 1 and first.tree_path == path
        error = None
        if is_leaf:
            key = (first.row_id, first.sample_index)
            credit = self.credit.get(key)
            outputs.update(reward=first.reward, status=first.status,
                           advantage=credit.advantage if credit else None,
                           trace_id=self.traced.get(key))
            attrs.update(attributes(sample_index=first.sample_index,
                                    leaf_trace_id=self.traced.get(key)))
            error = first.error if first.status != "ok" else None
        kind = "AGENT" if parent is None else "CHAIN"
        name = (f"tree {_name(path)}" if parent is None
                else f"{'leaf' if is_leaf else 'branch'} {_name(path)}")
        span = self.builder.add(parent, name, kind, start, end, inputs or {"node": _name(path)},
                                outputs, attrs, error)
        for i, when in zip(own, times, strict=True):
            self._call(span, shared[i], i, when or (start, start))
        if not is_leaf:
            children: dict[int, list[Trajectory]] = {}
            for leaf in under:  # a leaf on this node ends here: it has no child
                if len(leaf.tree_path) > len(path):
                    children.setdefault(leaf.tree_path[len(path)], []).append(leaf)
            for child, leaves in sorted(children.items()):
                self._node(span, [*path, child], leaves, mean, len(shared), start)
        return span

    def _call(self, parent: int, call: LLMCall, index: int, when: tuple[int, int]) -> None:
        attrs = attributes(kind="llm", node=call.node, turn=call.turn, call_index=index,
                           policy_version=call.policy_version, response_ids=call.response_ids,
                           response_logprobs=call.response_logprobs)
        self.builder.add(parent, f"llm · {call.node} · turn {call.turn}", "CHAT_MODEL", *when,
                         {"prompt_tokens": len(call.prompt_ids)},
                         {"response_text": decode_ids(self.tokenizer, call.response_ids),
                          "generated_tokens": len(call.response_ids),
                          "finish_reason": call.finish_reason}, attrs, None)


def _groups(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Each row's tree leaves (those with a reward: what credit is computed from)."""
    by_row: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.tree_path and t.reward is not None:
            by_row.setdefault(t.row_id, []).append(t)
    return by_row


def _under(leaves: list[Trajectory], prefix: list[int]) -> list[Trajectory]:
    return [t for t in leaves if t.tree_path[: len(prefix)] == prefix]


def _mean_reward(leaves: list[Trajectory]) -> float:
    return sum(t.reward or 0.0 for t in leaves) / len(leaves) if leaves else 0.0


def _name(path: list[int]) -> str:
    return ".".join(map(str, path))


def _shared_calls(leaves: list[Trajectory]) -> list[LLMCall]:
    """The calls every one of ``leaves`` holds, from the first on (the same objects)."""
    shared = list(leaves[0].calls)
    for leaf in leaves[1:]:
        pairs = list(zip(shared, leaf.calls))
        del shared[next((i for i, (a, b) in enumerate(pairs) if a is not b), len(pairs)):]
    return shared


def _call_time(leaf: Trajectory, index: int) -> tuple[int, int] | None:
    """When call ``index`` of ``leaf`` ran (its traced event), if events were recorded."""
    for event in leaf.events:
        if event.kind == "llm" and event.call_index == index:
            return event.start_ns, event.end_ns or event.start_ns
    return None


def _span_of(leaves: list[Trajectory]) -> tuple[int, int]:
    """The first start and the last end of ``leaves``' events (now, if none were recorded)."""
    starts = [e.start_ns for t in leaves for e in t.events]
    ends = [e.end_ns or e.start_ns for t in leaves for e in t.events]
    return (min(starts), max(ends)) if starts else now_pair()
