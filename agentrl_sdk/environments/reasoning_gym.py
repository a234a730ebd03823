"""reasoning-gym's procedural tasks as rows, a reward and a graph of this SDK.

    env = reasoning_gym("chain_sum", size=2000, seed=1, eval_size=64, eval_seed=2)
    sdk.train(env.graph, env.rows, env.reward, config, eval_dataset=env.eval_rows)

The rows are exactly what ``reasoning_gym.create_dataset(name, size=, seed=, **config)``
generates (a weighted mix: its ``CompositeDataset``), each keeping its reasoning-gym entry for
the verifier; the reward is the task's own ``score_answer`` on the answer extracted from the
final reply, as the component ``reasoning_gym/<task>``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agentrl_sdk.environments.answers import (
    AnswerExtractor,
    AnswerMode,
    answer_extractor,
    final_reply,
)
from agentrl_sdk.environments._imports import import_environment_library
from agentrl_sdk.environments.calculator import calculator
from agentrl_sdk.graph import ToolNode, chat_model, tools_condition, trainable

__all__ = [
    "ReasoningGym",
    "ReasoningGymReward",
    "VerifierError",
    "reasoning_gym",
    "single_turn_graph",
    "task_names",
    "tool_graph",
]

ROW_KEY = "reasoning_gym"
"""The row field that keeps the reasoning-gym entry (question, answer, metadata)."""

SYSTEM_PROMPTS = {
    "tag": "Answer the question. Write only the final answer between <answer> and </answer>, "
           "for example <answer>42</answer>.",
    "last_line": "Answer the question. Write the final answer alone on the last line.",
    "custom": "Answer the question.",
}
TOOL_HINT = " Use the calculator tool for arithmetic."


class VerifierError(RuntimeError):
    """A task's ``score_answer`` raised: the rollout's reward error (counted as
    ``count/reward_errors`` and scored per ``reward.on_error``), never a crash."""


def _require() -> Any:
    return import_environment_library(
        "reasoning_gym", "reasoning-gym is not installed: pip install "
        "'agentrl-sdk[environments]' (or pip install reasoning-gym)")


def task_names() -> list[str]:
    """Every task reasoning-gym registers (``composite`` excluded: pass a mix instead)."""
    return sorted(n for n in _require().factory.DATASETS if n != "composite")


def _check_names(names: Sequence[str]) -> None:
    known = task_names()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"unknown reasoning-gym task {name!r}.{hint} Its "
                             f"{len(known)} tasks: {', '.join(known)}")


def _weights(tasks: str | Sequence[str] | Mapping[str, float]) -> dict[str, float]:
    if isinstance(tasks, str):
        weights = {tasks: 1.0}
    elif isinstance(tasks, Mapping):
        weights = {str(k): float(v) for k, v in tasks.items()}
    else:
        weights = {str(name): 1.0 for name in tasks}
    if not weights:
        raise ValueError("name at least one reasoning-gym task")
    if any(w <= 0 for w in weights.values()):
        raise ValueError(f"mix weights must be positive, got {weights}")
    _check_names(list(weights))
    return weights


def _dataset(weights: dict[str, float], size: int, seed: int,
             config: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """reasoning-gym's dataset for ``weights`` (one task, or its composite of a mix) and the
    dataset that scores each task's entries."""
    rg = _require()
    config = dict(config or {})
    if len(weights) == 1:
        (name,) = weights
        dataset = rg.create_dataset(name, size=size, seed=seed, **config)
        return dataset, {name: dataset}
    unknown = set(config) - set(weights)
    if unknown:
        raise ValueError(f"config of a mix is per task ({{task: {{option: value}}}}); "
                         f"{sorted(unknown)} are not in the mix {sorted(weights)}")
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    specs = [DatasetSpec(name=n, weight=w, config=dict(config.get(n) or {}))
             for n, w in weights.items()]
    composite = CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
    return composite, dict(composite.datasets)


def _rows(dataset: Any, default_task: str, split: str, seed: int,
          system_prompt: str) -> list[dict[str, Any]]:
    rows = []
    for i, entry in enumerate(dataset):
        task = (entry.get("metadata") or {}).get("source_dataset") or default_task
        messages = [{"role": "user", "content": entry["question"]}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        rows.append({
            "id": f"{task}-{split}{seed}-{i}",
            "messages": messages,
            "data_source": f"reasoning_gym/{task}",
            "reward_model": {"style": "rule", "ground_truth": entry["answer"]},
            ROW_KEY: {"task": task, "entry": entry},
        })
    return rows


class ReasoningGymReward:
    """``reward(final_state, row, trajectory)``: the task's own ``score_answer`` on the answer
    extracted from the final reply, as the component ``reasoning_gym/<task>``.

    A reply that has no answer (no tag, a final tool call) is scored as reasoning-gym scores
    ``None``: 0. A verifier that raises raises `VerifierError` naming the task and the row,
    which the rollout counts as a reward error (``count/reward_errors``, the trajectory's
    ``error``) and scores per ``reward.on_error``.
    """

    __name__ = "reasoning_gym_reward"

    def __init__(self, scorers: Mapping[str, Any], extract: AnswerExtractor):
        self.scorers = dict(scorers)
        self.extract = extract

    def answer(self, state: Any) -> str | None:
        """The answer the verifier sees for ``state``'s final reply."""
        reply = final_reply(state)
        return None if reply is None else self.extract(reply)

    def __call__(self, state: Any, row: Mapping[str, Any], trajectory: Any) -> dict[str, float]:
        kept = row.get(ROW_KEY)
        if not isinstance(kept, Mapping) or "entry" not in kept:
            raise ValueError(f"row {row.get('id')!r} has no {ROW_KEY!r} entry: score rows "
                             "made by agentrl_sdk.environments.reasoning_gym")
        entry, task = kept["entry"], kept["task"]
        scorer = self.scorers.get(task)
        if scorer is None:
            raise ValueError(f"row {row.get('id')!r} is a {task!r} task; this reward scores "
                             f"{sorted(self.scorers)}")
        answer = self.answer(state)
        try:
            value = float(scorer.score_answer(answer, entry))
        except Exception as exc:
            raise VerifierError(f"reasoning-gym's {task} verifier raised on row "
                                f"{row.get('id')!r} (answer {answer!r}): "
                                f"{type(exc).__name__}: {exc}") from exc
        return {f"reasoning_gym/{task}": value}


class _State(TypedDict):
    messages: Annotated[list, add_messages]


def single_turn_graph(node: str = "solver", policy: str = "default") -> Any:
    """One trainable LLM call that answers the row's messages: START -> ``node`` -> END."""

    @trainable(node, policy=policy)
    async def solve(state: _State, config) -> dict:
        """Ask the policy for the answer."""
        return {"messages": [await chat_model(config).ainvoke(state["messages"])]}

    graph = StateGraph(_State)
    graph.add_node(node, solve)
    graph.add_edge(START, node)
    graph.add_edge(node, END)
    return graph.compile()


def tool_graph(tools: Sequence[BaseTool], node: str = "solver", policy: str = "default",
               *, timeout_s: float | None = 10.0) -> Any:
    """A ReAct loop: ``node`` -> (tools -> ``node``)* -> END, ``node`` trainable; malformed
    calls and tool errors go back to the model as error messages (`agentrl_sdk.ToolNode`)."""
    tools = list(tools)

    @trainable(node, policy=policy)
    async def solve(state: _State, config) -> dict:
        """Ask the policy for the next step: a tool call or the answer."""
        llm = chat_model(config).bind_tools(tools)
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(_State)
    graph.add_node(node, solve)
    graph.add_node("tools", ToolNode(tools, timeout_s=timeout_s))
    graph.add_edge(START, node)
    graph.add_conditional_edges(node, tools_condition)
    graph.add_edge("tools", node)
    return graph.compile()


@dataclass(frozen=True)
class ReasoningGym:
    """A reasoning-gym task (or mix) ready to train: rows, held-out rows, reward, graph.

    Attributes:
        tasks: The tasks and their mix weights.
        rows: Training rows (``messages``, ``data_source``, ``reward_model`` and the
            reasoning-gym entry under ``"reasoning_gym"``), without any row whose question is
            held out.
        eval_rows: Held-out rows from ``eval_seed``.
        reward: The verifier reward (`ReasoningGymReward`).
        graph: The compiled default graph: one trainable call, or the ReAct loop with tools.
        tools: The tools the graph offers (empty for the single-turn graph).
        dropped: Training rows left out because their question is also held out.
    """

    tasks: dict[str, float]
    rows: list[dict[str, Any]] = field(repr=False)
    eval_rows: list[dict[str, Any]] = field(repr=False)
    reward: ReasoningGymReward = field(repr=False)
    graph: Any = field(repr=False)
    tools: list[BaseTool] = field(default_factory=list, repr=False)
    system_prompt: str = ""
    dropped: int = 0


def _tools(tools: None | str | Sequence[BaseTool]) -> list[BaseTool]:
    if tools is None:
        return []
    if tools == "calculator":
        return [calculator]
    if isinstance(tools, str):
        raise ValueError(f"tools must be None, 'calculator' or a list of LangChain tools, "
                         f"got {tools!r}")
    return list(tools)


def reasoning_gym(
    tasks: str | Sequence[str] | Mapping[str, float],
    *,
    size: int = 1000,
    seed: int = 0,
    eval_size: int = 64,
    eval_seed: int | None = None,
    config: Mapping[str, Any] | None = None,
    answer: AnswerMode | Callable[[str], str | None] = "tag",
    tools: None | str | Sequence[BaseTool] = None,
    system_prompt: str | None = None,
) -> ReasoningGym:
    """A reasoning-gym task, or a weighted mix of tasks, as rows, reward and graph.

    Args:
        tasks: A task name (``"chain_sum"``), several (equal weights) or ``{name: weight}``
            (reasoning-gym's ``CompositeDataset``: each row's task drawn by weight).
        size: Training rows generated (before held-out questions are removed).
        eval_seed: The held-out rows' seed. reasoning-gym makes row ``i`` of seed ``s`` from
            ``Random(s + i)``, so the seeds of the two sets must be further apart than their
            row counts; the default, ``seed + size + len(tasks)``, is the first seed that is.
        config: The task's generator options (``{"min_terms": 2, ...}``); for a mix, per task
            (``{"chain_sum": {...}}``).
        answer: How the answer is read from the final reply: ``"tag"`` the last
            ``<answer>...</answer>`` (reasoning-gym's convention), ``"last_line"`` the last
            non-empty line, or a function ``text -> answer | None``.
        tools: ``"calculator"`` (a safe ``ast`` calculator) or LangChain tools: the graph is
            then a ReAct loop.
        system_prompt: The rows' system message; None picks one for ``answer`` (and
            ``tools``), ``""`` sends none.

    Raises:
        ValueError: an unknown task (with close matches and every name), seeds too close,
            a bad ``answer`` or ``tools``.
    """
    weights = _weights(tasks)
    if size < 1 or eval_size < 0:
        raise ValueError(f"size must be >= 1 and eval_size >= 0, got {size} and {eval_size}")
    # reasoning-gym draws row i of seed s from Random(s + i) (a mix's tasks from s + 1 + k):
    # seeds closer than the row count give the same rows shifted, so the ranges must not meet.
    span, eval_span = size + len(weights), eval_size + len(weights)
    eval_seed = seed + span if eval_seed is None else eval_seed
    if eval_size and seed - eval_span < eval_seed < seed + span:
        raise ValueError(
            f"eval_seed {eval_seed} is too close to seed {seed}: reasoning-gym makes row i of "
            f"seed s from Random(s + i), so these held-out rows would repeat training rows; "
            f"use eval_seed >= {seed + span} or <= {seed - eval_span} (default: {seed + span})")
    extract = answer_extractor(answer)
    tool_list = _tools(tools)
    if system_prompt is None:
        system_prompt = SYSTEM_PROMPTS[answer if isinstance(answer, str) else "custom"]
        system_prompt += TOOL_HINT if tool_list else ""
    first = next(iter(weights))
    train_set, scorers = _dataset(weights, size, seed, config)
    eval_rows = []
    if eval_size:
        eval_set, _ = _dataset(weights, eval_size, eval_seed, config)
        eval_rows = _rows(eval_set, first, "eval", eval_seed, system_prompt)
    held_out = {r[ROW_KEY]["entry"]["question"] for r in eval_rows}
    rows = _rows(train_set, first, "train", seed, system_prompt)
    kept = [r for r in rows if r[ROW_KEY]["entry"]["question"] not in held_out]
    if not kept:
        raise ValueError("every training question is also held out: use a larger task "
                         "config or fewer held-out rows")
    return ReasoningGym(
        tasks=weights, rows=kept, eval_rows=eval_rows,
        reward=ReasoningGymReward(scorers, extract),
        graph=tool_graph(tool_list) if tool_list else single_turn_graph(),
        tools=tool_list, system_prompt=system_prompt, dropped=len(rows) - len(kept),
    )
