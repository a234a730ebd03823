"""Tree rollouts (``rollout.tree``): continuations resume from the checkpoint the graph saved
after a tool node, token-exact against running the prefix again; forked ledgers share the
trunk by identity; a group keeps n leaves; RLTools fork through their hook or are refused;
leaves train with Tree-GRPO advantages."""

from __future__ import annotations

import asyncio
import copy
import json
import statistics
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

import agentrl_sdk as sdk
from agentrl_sdk.algorithms.config import AlgorithmConfig
from agentrl_sdk.chat import ChatTemplate
from agentrl_sdk.chat.context import NodeTag
from agentrl_sdk.chat.ledger import TokenLedger
from agentrl_sdk.config import TreeConfig
from agentrl_sdk.pipeline.config import EvalConfig
from agentrl_sdk.rollout.tree import check_forkable
from agentrl_sdk.tracing.traces import build_trace_payload, trace_tags
from agentrl_sdk.tracing.tree_traces import build_tree_payloads, tree_credit
from agentrl_sdk.types import GenerateResult, RewardComponent, Trajectory
from examples.calculator.agent import build_graph, calculator, react_graph
from tests.rollout._samples import build_samples
from tests.rollout.conftest import CALC_ROWS

GREEDY = sdk.SamplingParams(temperature=0.0, max_tokens=48)


def _tree(n: int, branches: int = 2, depth: int = 1, **tree: Any) -> sdk.RolloutConfig:
    return sdk.RolloutConfig(n=n, sampling=GREEDY, tree=TreeConfig(
        enabled=True, branches=branches, depth=depth, **tree))


async def test_forks_resume_token_exact_against_running_the_prefix_again(calc_engine,
                                                                           qwen_tokenizer):
    row = CALC_ROWS[1]
    (chain,) = await sdk.arollout(build_graph(), row, calc_engine, tokenizer=qwen_tokenizer,
                                  config=sdk.RolloutConfig(sampling=GREEDY))
    assert chain.status == "ok" and len(chain.calls) == 3  # call, tool, call, tool, answer
    leaves = await sdk.arollout(build_graph(), row, calc_engine, tokenizer=qwen_tokenizer,
                                config=_tree(8, depth=2))
    assert [leaf.tree_path for leaf in leaves] == [
        [t, a, b] for t in (0, 1) for a in (0, 1) for b in (0, 1)]
    assert [leaf.sample_index for leaf in leaves] == list(range(8))
    for leaf in leaves:
        assert leaf.status == "ok", leaf.error
        (seg,), (want,) = leaf.segments, chain.segments
        # Greedy: every leaf is the chain, token for token, mask for mask.
        assert (seg.prompt_ids, seg.response_ids, seg.response_mask) == (
            want.prompt_ids, want.response_ids, want.response_mask)
        assert [c.prompt_ids for c in leaf.calls] == [c.prompt_ids for c in chain.calls]
        assert seg.response_logprobs == pytest.approx(want.response_logprobs, abs=1e-4)
        assert [m.content for m in leaf.final_state["messages"]] == [
            m.content for m in chain.final_state["messages"]]
    # The trunk was generated once per tree: 2 trees x 1 call, 4 paths x 1, 8 leaves x 1.
    assert sum(leaf.metrics["llm_calls"] for leaf in leaves) == 2 + 4 + 8
    assert sum(leaf.metrics["generated_tokens"] for leaf in leaves) == sum(
        len(c.response_ids) * k for c, k in zip(chain.calls, (2, 4, 8), strict=True))
    # Leaves of a tree hold the trunk's calls and prompt list themselves, not copies.
    first, second = leaves[0], leaves[3]
    assert first.calls[0] is second.calls[0] and first.calls[1] is not second.calls[1]
    assert first.segments[0].prompt_ids is second.segments[0].prompt_ids
    assert leaves[4].calls[0] is not first.calls[0]  # another tree


async def test_forked_ledgers_share_segments_and_record_only_their_own_tokens(qwen_tokenizer):
    ledger = TokenLedger(ChatTemplate(qwen_tokenizer))
    node = NodeTag("solver")
    done = [{"role": "user", "content": "other task"}]
    talk = [{"role": "user", "content": "2+3?"}]

    def reply(text):
        ids = qwen_tokenizer.encode(text)
        return GenerateResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                              policy_version=0)

    def call(ledger, messages, text):
        plan = ledger.plan(messages, None, node)
        ledger.commit(plan, reply(text), {"role": "assistant", "content": text}, "r")
        return [*messages, {"role": "assistant", "content": text}]

    call(ledger, done, "done")
    talk = call(ledger, talk, "let me add")  # segment 1, going on after the fork
    parent = [list(s.response_ids) for s in ledger.segments]
    left, right = ledger.fork(), ledger.fork()
    call(left, [*talk, {"role": "user", "content": "tool says 5"}], "5")
    call(right, [*talk, {"role": "user", "content": "tool says 6"}], "6")
    for child, answer in ((left, "5"), (right, "6")):
        assert child.segments[0] is ledger.segments[0]  # untouched: the parent's own object
        branch = child.segments[1]
        assert branch.base is ledger.segments[1]
        assert branch.prompt_ids is ledger.segments[1].prompt_ids
        assert qwen_tokenizer.decode(branch.response_ids).endswith(answer)  # only its tokens
        assert len(branch.response_ids) < len(ledger.segments[1].response_ids) + 20
        whole, calls = child.settled()
        assert whole[1].response_ids[: len(parent[1])] == parent[1]
        assert whole[1].response_ids[len(parent[1]):] == branch.response_ids
        assert calls[-1].prompt_ids == whole[1].token_slice(0, calls[-1].prompt_length)
    assert [list(s.response_ids) for s in ledger.segments] == parent  # the parent unchanged


class State(TypedDict):
    messages: Annotated[list, add_messages]


RELEASED: list[int] = []  # the count each released instance had


class _NoArgs(BaseModel):
    pass


class Counter(sdk.RLTool):
    """Counts its calls per rollout; its reward is the count (forkable: plain data)."""

    name: str = "count"
    description: str = "Count."
    args_schema: type[BaseModel] = _NoArgs

    async def create(self, **kwargs):
        return {"count": 0}

    async def execute(self, instance, **arguments):
        instance["count"] += 1
        return str(instance["count"])

    async def calc_reward(self, instance, **kwargs):
        return float(instance["count"])

    async def release(self, instance, **kwargs):
        RELEASED.append(instance["count"])

    async def fork(self, instance):
        return copy.deepcopy(instance)


class NoFork(Counter):
    name: str = "nofork"

    fork = sdk.RLTool.fork


def _scripted_graph(tool):
    """No LLM: the agent calls ``tool`` while the thread's budget lasts; root 0's first path
    ends at once (no tool call), so its tree makes one leaf and root 1's branch point the rest."""

    def agent(state: State, config) -> dict:
        calls = sum(isinstance(m, AIMessage) for m in state["messages"])
        ends = config["configurable"]["thread_id"].startswith("r:t0") or calls >= 2
        tool_calls = [] if ends else [{"name": tool.name, "args": {}, "id": f"c{calls}"}]
        return {"messages": [AIMessage(content=f"turn {calls}", tool_calls=tool_calls)]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", sdk.ToolNode([tool]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", sdk.tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def test_a_group_keeps_n_leaves_and_each_branch_forks_its_tools(qwen_tokenizer, scripted):
    RELEASED.clear()
    row = {"id": "r", "messages": [HumanMessage("count")]}
    leaves = await sdk.arollout(_scripted_graph(Counter()), row, scripted(qwen_tokenizer, []),
                                tokenizer=qwen_tokenizer, config=_tree(8, depth=2))
    # Tree 0 ended before its branch point: one leaf. Tree 1 makes its 4, and its branch point
    # the 3 tree 0 did not: continuation 2 (branched again: 2 leaves) and 3 (1, not branched);
    # no root is run from the start again.
    assert [leaf.tree_path for leaf in leaves] == [
        [0], [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1], [1, 2, 0], [1, 2, 1], [1, 3]]
    assert all(leaf.status == "ok" for leaf in leaves)
    # Each leaf's tool instance is its own copy: two calls on every branched path.
    assert [leaf.rewards.get("tool/count") for leaf in leaves] == [None] + [2.0] * 7
    # Released once each: root 1's when the group ends (1 call), the inner paths' (2), the
    # leaves' (2).
    assert sorted(RELEASED) == [1] + [2] * 3 + [2] * 7
    assert sum(leaf.metrics.get("tools_created", 0) for leaf in leaves) == 1  # one root used it


async def test_skip_first_branches_after_the_routine_steps_a_root_went_through(
        qwen_tokenizer, scripted):
    RELEASED.clear()
    row = {"id": "r", "messages": [HumanMessage("count")]}
    leaves = await sdk.arollout(_scripted_graph(Counter()), row, scripted(qwen_tokenizer, []),
                                tokenizer=qwen_tokenizer, config=_tree(4, skip_first=1))
    assert [leaf.tree_path for leaf in leaves] == [[0], [1, 0], [1, 1], [1, 2]]
    # Root 1 went through its first tool result and branched after its second: each
    # continuation only answers (no more calls), and the root's instance had counted 2.
    assert [leaf.rewards.get("tool/count") for leaf in leaves] == [None, 2.0, 2.0, 2.0]
    assert sorted(RELEASED) == [2] * 4
    texts = [[m.content for m in leaf.final_state["messages"] if isinstance(m, AIMessage)]
             for leaf in leaves[1:]]
    assert texts == [["turn 0", "turn 1", "turn 2"]] * 3


async def test_tools_without_a_fork_and_graphs_without_branch_points_are_refused_at_start():
    with pytest.raises(ValueError, match="'nofork' does not implement fork"):
        check_forkable(_scripted_graph(NoFork()), TreeConfig(enabled=True))
    check_forkable(_scripted_graph(NoFork()), TreeConfig())  # trees off: nothing to check
    with pytest.raises(ValueError, match="does not have"):
        check_forkable(build_graph(), TreeConfig(enabled=True, branch_after=["search"]))
    plain = StateGraph(State)
    plain.add_node("agent", lambda s: {"messages": []})
    plain.add_edge(START, "agent")
    plain.add_edge("agent", END)
    with pytest.raises(ValueError, match="no tool node"):
        check_forkable(plain.compile(), TreeConfig(enabled=True))
    with pytest.raises(ValueError, match="multiple of tree.branches"):
        sdk.RolloutConfig(n=6, tree={"enabled": True, "branches": 2, "depth": 2})
    # Held-out evaluations sample from the start: independent samples measure the policy.
    assert not EvalConfig().rollout(_tree(8)).tree.enabled


REWARDS = {(0, 0): 1.0, (0, 1): 1.0, (1, 0): 1.0, (1, 1): 0.0}


def _leaves() -> list[Trajectory]:
    return [
        Trajectory(row_id="r", sample_index=i, tree_path=list(path), segments=[sdk.Segment(
            node="solver", prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
            response_logprobs=[0.0, 0.0], response_versions=[0, 0])],
            components=[RewardComponent(name="outcome", value=r)], reward=r)
        for i, (path, r) in enumerate(REWARDS.items())
    ]  # fmt: skip


def test_leaves_train_with_tree_grpo_advantages():
    rewards, trajectories = REWARDS, _leaves()
    estimator = AlgorithmConfig(advantage_estimator="tree").estimator
    samples, _ = build_samples(trajectories, estimator=estimator)

    def grpo(values):
        mean, std = statistics.fmean(values), statistics.stdev(values)
        return [(v - mean) / (std + 1e-6) for v in values]

    group = grpo(list(rewards.values()))
    within = grpo([1.0, 1.0]) + grpo([1.0, 0.0])
    want = [g + w for g, w in zip(group, within, strict=True)]
    got = [s.token_advantages[0] for s in samples]
    assert got == pytest.approx(want, abs=1e-5)
    assert got[2] > got[0] > 0 > got[3]  # the leaf that beat its sibling gains more


def test_a_leafs_trace_shows_its_path_and_what_each_node_on_it_earned():
    leaves = _leaves()
    credit = tree_credit(leaves)
    # Leaf 1.0: tree 1 averages 0.5 against the group's 0.75; the leaf's 1.0 beats its tree.
    assert credit[("r", 2)] == [
        {"node": "1", "leaves": 2, "mean_reward": 0.5, "credit": -0.25},
        {"node": "1.0", "leaves": 1, "mean_reward": 1.0, "credit": 0.5}]
    info, spans = build_trace_payload(leaves[2], experiment_id="0", step=3,
                                      tree=credit[("r", 2)])  # fmt: skip
    assert info.tags["tree_path"] == "1.0" and info.tags["mlflow.traceName"].endswith("(tree 1.0)")
    assert json.loads(spans[0]["attributes"]["agentrl.tree"]) == credit[("r", 2)]
    chain = leaves[0].model_copy(update={"tree_path": None})
    assert tree_credit([chain]) == {} and "tree_path" not in trace_tags(chain, 3, None)


class _StuckFork(Counter):
    name: str = "count"
    timeout_s: float | None = 0.2

    async def fork(self, instance):
        await asyncio.sleep(3600)


async def test_a_fork_that_hangs_ends_its_path_as_a_counted_error_leaf(qwen_tokenizer, scripted):
    RELEASED.clear()
    row = {"id": "r", "messages": [HumanMessage("count")]}
    leaves = await asyncio.wait_for(sdk.arollout(
        _scripted_graph(_StuckFork()), row, scripted(qwen_tokenizer, []),
        tokenizer=qwen_tokenizer, config=_tree(4)), 30)
    failed = [leaf for leaf in leaves if leaf.status != "ok"]
    assert failed and all("fork failed" in leaf.error for leaf in failed)
    assert sum(leaf.metrics.get("tree_fork_failed", 0) for leaf in leaves) == len(failed)
    assert len(leaves) == 4 and len(RELEASED) == sum(1 for leaf in leaves if leaf.rewards)  # once each


class _Expression(BaseModel):
    expression: str


class _CalculatorForkingOnce(sdk.RLTool):
    """The calculator as an RLTool whose instances fork once: a second fork of the same
    instance fails (a sibling continuation whose copy cannot be made)."""

    name: str = "calculator"
    description: str = "Evaluate an arithmetic expression such as (2+3)*4."
    args_schema: type[BaseModel] = _Expression

    async def create(self, **kwargs):
        return {"forks": 0}

    async def execute(self, instance, expression: str):
        return await calculator.ainvoke({"expression": expression})

    async def release(self, instance, **kwargs):
        RELEASED.append(instance["forks"])

    async def fork(self, instance):
        if instance["forks"]:
            raise RuntimeError("no second copy")
        instance["forks"] += 1
        return {"forks": 0}


async def test_a_sibling_fork_failing_after_the_probe_ends_the_probe_with_the_trunks_counts(
        calc_engine, qwen_tokenizer):
    # The gate's probe (continuation 0) forks and makes its call; its sibling's fork fails.
    RELEASED.clear()
    leaves = await asyncio.wait_for(sdk.arollout(
        react_graph([_CalculatorForkingOnce()]), CALC_ROWS[1], calc_engine,
        tokenizer=qwen_tokenizer, config=_tree(4, min_entropy=0.0)), 60)
    # Each tree's probe is its error leaf; a further root (one leaf: no branching) makes the rest.
    assert [leaf.tree_path for leaf in leaves] == [[0, 0], [1, 0], [2], [3]]
    failed, chains = leaves[:2], leaves[2:]
    for leaf in failed:
        assert leaf.status == "graph_error" and "no second copy" in leaf.error
        assert leaf.metrics["tree_fork_failed"] == 1
        # The trunk's call and counters, and the probe's own call after the tool result.
        assert leaf.metrics["llm_calls"] == 2 and leaf.metrics["tools_created"] == 1
        assert len(leaf.segments[0].response_ids) > 0
    assert all(leaf.status == "ok" and leaf.metrics["llm_calls"] == 3 for leaf in chains)
    # Released once each: the two trunks (forked once) unscored, the probes, the chains.
    assert sorted(RELEASED) == [0, 0, 0, 0, 1, 1]


class _SureUntilToolResults:
    """The tiny calculator policy's replies, with the surprisal of every sampled token set by
    how many tool results the prompt holds (a fake's logprobs, for the entropy gate)."""

    def __init__(self, engine, tokenizer, surprisal: dict[int, float]):
        self.engine, self.tokenizer, self.surprisal = engine, tokenizer, surprisal

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        result = await self.engine.generate(prompt_ids, sampling, request_id)
        results = self.tokenizer.decode(prompt_ids).count("<tool_response>")
        return result.model_copy(update={
            "logprobs": [-self.surprisal[results]] * len(result.token_ids)})

    async def update_weights(self, state_dict):
        raise NotImplementedError

    async def health(self):
        return True


@pytest.mark.parametrize(("min_entropy", "paths", "calls", "declined"), [
    # At or above the bar everywhere: the plain trees, and continuation 0 keeps the call it
    # made to find out (2 + 4 + 8 calls, as without the gate).
    (0.0, [[t, a, b] for t in (0, 1) for a in (0, 1) for b in (0, 1)], 2 + 4 + 8, 0),
    # Unsure after the first tool result only: branched there; at the second, each path goes
    # on alone and its sibling is a new root run from the start (trees 2-5, chains).
    (1.0, [[0, 0], [0, 1], [1, 0], [1, 1], [2], [3], [4], [5]], 2 * (1 + 2 + 2) + 4 * 3, 4),
    # Sure everywhere: every leaf a chain from the start, as many calls as 8 chains make.
    (5.0, [[i] for i in range(8)], 8 * 3, 6),
])
async def test_an_entropy_gated_tree_branches_only_before_unsure_calls(
        calc_engine, qwen_tokenizer, min_entropy, paths, calls, declined):
    row = CALC_ROWS[1]
    engine = _SureUntilToolResults(calc_engine, qwen_tokenizer, {0: 0.1, 1: 2.0, 2: 0.1})
    (chain,) = await sdk.arollout(build_graph(), row, engine, tokenizer=qwen_tokenizer,
                                  config=sdk.RolloutConfig(sampling=GREEDY))
    leaves = await sdk.arollout(build_graph(), row, engine, tokenizer=qwen_tokenizer,
                                config=_tree(8, depth=2, min_entropy=min_entropy))
    assert [leaf.tree_path for leaf in leaves] == paths
    for leaf in leaves:  # greedy: every leaf is the chain, however it was grown
        assert leaf.status == "ok", leaf.error
        (seg,), (want,) = leaf.segments, chain.segments
        assert (seg.prompt_ids, seg.response_ids, seg.response_mask) == (
            want.prompt_ids, want.response_ids, want.response_mask)
    assert sum(leaf.metrics["llm_calls"] for leaf in leaves) == calls
    assert sum(leaf.metrics.get("tree_branch_declined", 0) for leaf in leaves) == declined


async def test_one_trace_draws_each_tree_with_every_call_generated_once(calc_engine,
                                                                        qwen_tokenizer):
    from agentrl_sdk.tracing.traces import RolloutCredit, trace_entities

    leaves = await sdk.arollout(build_graph(), CALC_ROWS[1], calc_engine, record_events=True,
                                tokenizer=qwen_tokenizer, config=_tree(8, depth=2))
    for leaf, reward in zip(leaves, [1, 1, 0, 1, 0, 0, 0, 1], strict=True):
        leaf.reward = float(reward)
    traced = {(leaf.row_id, leaf.sample_index): f"tr-leaf{leaf.sample_index}"
              for leaf in leaves if leaf.tree_path[0] == 1}  # fmt: skip
    credit = {key: RolloutCredit(advantage=0.5, loss_share=0.125) for key in traced}
    (payload,) = build_tree_payloads(leaves, traced, experiment_id="0", step=3, credit=credit,
                                     tokenizer=qwen_tokenizer)  # only tree 1 had a leaf traced
    info, spans = trace_entities(payload)
    assert info.tags["kind"] == "tree" and info.tags["tree_path"] == "1"
    assert info.tags["tree_leaves"] == "4" and info.tags["mlflow.traceName"] == (
        f"tree {CALC_ROWS[1]['id']} · 1")
    by_id = {s.span_id: s for s in spans}

    def path_of(span):
        names = []
        while span is not None:
            names.append(span.name.split(" ")[-1] if span.name.startswith(("tree", "branch",
                                                                          "leaf")) else "llm")
            span = by_id.get(span.parent_id)
        return "/".join(reversed(names))

    assert sorted(path_of(s) for s in spans) == sorted([
        "1", "1/llm", "1/1.0", "1/1.0/llm", "1/1.1", "1/1.1/llm",
        *(f"1/1.{a}/1.{a}.{b}" for a in (0, 1) for b in (0, 1)),
        *(f"1/1.{a}/1.{a}.{b}/llm" for a in (0, 1) for b in (0, 1))])
    nodes = {s.attributes["agentrl.tree_node"]: s for s in spans
             if s.attributes.get("agentrl.kind") == "tree_node"}  # fmt: skip
    # The tree's leaves (1.0.0, 1.0.1, 1.1.0, 1.1.1) earned 0, 0, 0, 1: the tree 0.25 against
    # the group's 0.5, continuation 1.1 0.5 against its tree's 0.25.
    assert nodes["1"].outputs["mean_reward"] == 0.25 and nodes["1"].outputs["credit"] == -0.25
    assert nodes["1.1"].outputs["credit"] == 0.25 and nodes["1.1.1"].outputs["credit"] == 0.5
    assert nodes["1.1.1"].outputs["trace_id"] == "tr-leaf7"
    assert nodes["1.1.1"].outputs["reward"] == 1.0 and nodes["1.1.1"].outputs["advantage"] == 0.5
    # Each call appears once, under the node that made it, as many tokens as the engine made.
    tree_leaves = [leaf for leaf in leaves if leaf.tree_path[0] == 1]
    assert sum(s.attributes["agentrl.generated_tokens"] for s in nodes.values()) == sum(
        leaf.metrics["generated_tokens"] for leaf in tree_leaves)
    trunk = tree_leaves[0].calls[0]
    assert nodes["1"].outputs["generated"] == [qwen_tokenizer.decode(trunk.response_ids)]
    for span in spans:
        parent = by_id.get(span.parent_id)
        if parent is not None:
            assert parent.start_time_ns <= span.start_time_ns <= span.end_time_ns
            assert span.end_time_ns <= parent.end_time_ns
    # agentrl's own viewer reads it as a tree: `agentrl traces TRACE_ID` and --html
    from mlflow.entities import Trace, TraceData

    from agentrl_sdk.tracing import TraceView, render_trace, trace_html

    view = TraceView.from_trace(Trace(info, TraceData(spans)))
    assert view.title == f"row {CALC_ROWS[1]['id']} · tree 1 · step 3"
    assert view.summary()["leaves"] == 4 and view.summary()["status"] == "ok"
    assert [line.depth for line in view.spans].count(3) == 4  # the leaves' own calls
    render_trace(view)
    assert "leaf 1.1.1" in trace_html(view)
