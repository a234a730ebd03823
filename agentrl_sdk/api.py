"""`sdk.train` / `sdk.evaluate`, and `sdk.train_on_traces` / `sdk.finetune_on_traces`: wire a
graph, a dataset, a reward and a config into a training pipeline or an evaluation, or train a
model on the traces a selection holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl_sdk.config import NodeRule
from agentrl_sdk.data import DatasetLike, GraphInputCheck, load_rows
from agentrl_sdk.pipeline import (
    EvalResult,
    JobSpec,
    TrainConfig,
    TrainResult,
    run_evaluation,
    run_pipeline,
)
from agentrl_sdk.pipeline.offline import OfflineResult, train_on_samples
from agentrl_sdk.pipeline.policies import model_path
from agentrl_sdk.pipeline.rules import Schedule
from agentrl_sdk.production import TraceRecord, TraceSelection, training_batch
from agentrl_sdk.production.finetune import FinetuneResult, Retokenize, best_records, sft_examples
from agentrl_sdk.rollout import default_input
from agentrl_sdk.rollout.rewards import RewardFn
from agentrl_sdk.target import Target
from agentrl_sdk.threads import use_user_code_executor

ConfigLike = TrainConfig | Mapping[str, Any] | str | Path | None
NodeRules = Mapping[str, NodeRule | Mapping[str, Any]]
"""Path pattern -> attribution (``sdk.trainable(policy=...)``, ``sdk.frozen()``, a `NodeRule`
or its fields as a dict); see ``RolloutConfig.nodes``."""


def resolve_config(config: ConfigLike, **overrides: Any) -> TrainConfig:
    """A `TrainConfig` from an object, a dict or a YAML path, with top-level overrides."""
    if config is None:
        resolved = TrainConfig()
    elif isinstance(config, TrainConfig):
        resolved = config
    elif isinstance(config, Mapping):
        resolved = TrainConfig.model_validate(config)
    else:
        resolved = TrainConfig.from_yaml(config)
    if overrides:
        resolved = TrainConfig.model_validate({**resolved.model_dump(), **overrides})
    return resolved


def with_node_rules(config: TrainConfig, nodes: NodeRules | None) -> TrainConfig:
    """``config`` with ``nodes`` ahead of its own ``rollout.nodes`` (the first match wins)."""
    if not nodes:
        return config
    data = config.model_dump()
    given = {pattern: NodeRule.model_validate(
        rule.model_dump() if isinstance(rule, NodeRule) else rule) for pattern, rule in nodes.items()}
    kept = {k: v for k, v in data["rollout"]["nodes"].items() if k not in given}
    data["rollout"]["nodes"] = {**{k: r.model_dump() for k, r in given.items()}, **kept}
    return TrainConfig.model_validate(data)


async def atrain(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    eval_dataset: DatasetLike | None = None,
    nodes: NodeRules | None = None,
) -> TrainResult:
    """Async `train`, for callers that already run an event loop."""
    target, resolved = _resolve(graph, config, nodes)
    rows, skipped = _rows(target, dataset, resolved, input_fn)
    if resolved.epochs is not None:
        steps = resolved.epochs * (len(rows) // resolved.data.batch_size)
        resolved = resolved.model_copy(update={"max_steps": max(1, steps)})
    eval_rows: list[dict[str, Any]] = []
    if eval_dataset is not None:
        eval_rows, skipped_eval = _rows(target, eval_dataset, resolved, input_fn)
        skipped += skipped_eval
    elif resolved.evaluation.every:
        raise ValueError(
            f"evaluation.every is {resolved.evaluation.every} but no eval_dataset was given: "
            "pass sdk.train(..., eval_dataset=rows) or set evaluation.every to 0"
        )
    return await run_pipeline(
        JobSpec(target, rows, reward, resolved, input_fn=input_fn, skipped_rows=skipped,
                eval_rows=eval_rows),
        Schedule.of(resolved),
    )


def _resolve(graph: Any, config: ConfigLike, nodes: NodeRules | None) -> tuple[Target, TrainConfig]:
    """The checked target and the config with ``nodes``; the user code executor sized."""
    target = Target.of(graph)
    resolved = with_node_rules(resolve_config(config), nodes)
    use_user_code_executor(resolved.rollout.tool_threads)
    return target, resolved


def _rows(
    target: Target, dataset: DatasetLike, config: TrainConfig, input_fn: Callable[[dict], Any]
) -> tuple[list[dict], int]:
    """A dataset's valid rows and how many failed validation (``data.on_bad_row``): the row
    schema, the agent a row names, and whether ``input_fn`` makes an input its graph reads."""
    rows, problems = load_rows(dataset, on_bad_row=config.data.on_bad_row,
                               agent_names=target.agent_names,
                               input_check=GraphInputCheck(target, input_fn))
    return rows, len(problems)


def train(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    eval_dataset: DatasetLike | None = None,
    nodes: NodeRules | None = None,
) -> TrainResult:
    """Train the trainable nodes of ``graph`` with RL on ``dataset``.

    Runs rollouts of the graph on every row (``rollout.n`` samples each), token-exact
    trajectories, rewards, group advantages, a policy update on the trainer workers, weight
    sync to the engine, MLflow metrics and checkpoints — ``max_steps`` times.

    Args:
        graph: A compiled LangGraph graph; or an agent function ``agent(endpoint, row)``
            (async, or sync and run in a thread) that sends OpenAI chat completions to
            ``endpoint.base_url`` with ``endpoint.api_key``: its calls are recorded by the
            gateway (see `AgentEndpoint`); or ``{agent_name: graph_or_agent}``: each row then
            runs the one its ``agent_name`` names (``"default"`` when it has none).
        dataset: Dict rows, a JSONL/parquet path, or a HF ``Dataset``; verl-format rows
            (``prompt``, ``reward_model``, ``extra_info.tools_kwargs``...) are validated, each
            row's graph input is checked (``input_fn`` must build it, and it must hold a key
            the graph's input schema has), and a bad row is reported by index, id and field,
            then skipped and counted or refused (``data.on_bad_row``), before any step.
        reward: ``reward(final_state, row, trajectory)`` -> float or named components (an
            agent function's return value is its ``final_state``; rewards it posts to the
            gateway's ``/rollouts/<id>/reward`` add up with it).
        config: A `TrainConfig`, a dict, or a YAML path.
        input_fn: Row -> graph input (default: the row's ``messages``/``prompt``, else the
            row itself); also called once per row at load, to check it.
        eval_dataset: Held-out rows (same forms as ``dataset``) that ``evaluation.every``
            evaluates the policy on during training; results in ``TrainResult.evaluations``
            and as ``eval/...`` MLflow metrics.
        nodes: Attribution of nodes you do not decorate (a prebuilt agent's), by path
            pattern: ``{"researcher/*": sdk.trainable(policy="researcher"), "coder/*":
            sdk.frozen()}``. A node's path names the graph nodes it runs in, outermost first
            (``researcher/agent``); the first matching pattern wins; these come before the
            config's ``rollout.nodes``.
    """
    return asyncio.run(atrain(graph, dataset, reward, config, input_fn=input_fn,
                              eval_dataset=eval_dataset, nodes=nodes))


async def aevaluate(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    model: str | Path | None = None,
    nodes: NodeRules | None = None,
) -> EvalResult:
    """Async `evaluate`, for callers that already run an event loop."""
    target, resolved = _resolve(graph, config, nodes)
    if model is not None:
        resolved = resolved.model_copy(deep=True)
        resolved.model.path = str(model)
    rows, skipped = _rows(target, dataset, resolved, input_fn)
    return await run_evaluation(
        JobSpec(target, rows, reward, resolved, input_fn=input_fn, skipped_rows=skipped)
    )


def evaluate(
    graph: Any,
    dataset: DatasetLike,
    reward: RewardFn | None = None,
    config: ConfigLike = None,
    *,
    input_fn: Callable[[dict[str, Any]], Any] = default_input,
    model: str | Path | None = None,
    nodes: NodeRules | None = None,
) -> EvalResult:
    """Evaluate a policy on ``dataset``: rollouts, rewards and pass@k, no training.

    ``graph``, ``dataset``, ``reward``, ``config``, ``input_fn`` and ``nodes`` are as in
    `train`; ``config.evaluation`` says how (samples per row, sampling — greedy by default —
    and the pass threshold). Engines only: no trainer and no Ray unless the engines run in Ray
    actors. With tracking on, the metrics go to an MLflow run of their own and failed rollouts
    are traced (tag ``phase=eval``).

    Args:
        model: Evaluate this local model folder instead of ``config.model.path`` (e.g. a
            `TrainResult.final_model`).

    Returns:
        The metrics (``reward/mean``, ``pass_at_1``..., status counts) and the scored rollouts.
    """
    return asyncio.run(aevaluate(graph, dataset, reward, config, input_fn=input_fn, model=model,
                                 nodes=nodes))


def train_on_traces(
    selection: TraceSelection,
    config: ConfigLike,
    *,
    group: Callable[[TraceRecord], str] | None = None,
    per_call: bool | None = None,
    epochs: int = 1,
    samples_per_update: int | None = None,
    output_dir: str | Path | None = None,
) -> OfflineResult:
    """Off-policy RL on the traced tokens: ``config.model`` trained on the ids and behaviour
    logprobs ``selection``'s traces recorded, without generating anything.

    The traced ids are trained as they are (`TraceSelection.samples`; traces of another
    vocabulary are refused with `TraceMismatchError`, never retokenized). Advantages compare
    the rewards of the traces that share a ``group`` key (a prompt template, a task, a user
    segment) — one group of all traces when None — with ``algorithm.advantage_estimator``;
    each token's loss is weighted by its importance weight (see `train_on_samples`). Drop
    traces served by weights too old first with `TraceSelection.recent`.

    Args:
        selection: Traces with a reward (`sdk.traces(..., reward=...)`).
        config: A `TrainConfig`, a dict, or a YAML path: its model (the one the traces were
            served by, or one of its vocabulary), trainer and algorithm sections;
            ``rollout.sampling.temperature`` must be the serving temperature.
        group: A record's group key.
        per_call: One sample per LLM call (default: ``algorithm.step_level.enabled``).
        epochs: Passes over the traces.
        samples_per_update: Samples per update (all when None).
        output_dir: Where ``final_model`` is written (``checkpoint.dir`` when None).
    """
    from transformers import AutoTokenizer

    resolved = resolve_config(config)
    tokenizer = AutoTokenizer.from_pretrained(model_path(resolved.model), local_files_only=True)
    split = resolved.algorithm.step_level.enabled if per_call is None else per_call
    samples, extra = training_batch(selection.records, tokenizer, per_call=split,
                                    group=group or (lambda record: "all"))  # fmt: skip
    return train_on_samples(samples, resolved, extra=extra, epochs=epochs,
                            samples_per_update=samples_per_update,
                            output_dir=output_dir or resolved.checkpoint.dir)  # fmt: skip


def finetune_on_traces(
    selection: TraceSelection,
    model: str | Path,
    output_dir: str | Path,
    *,
    min_reward: float | None = None,
    top_fraction: float | None = None,
    retokenize: Retokenize = "auto",
    steps: int = 100,
    lr: float = 1e-5,
    batch_size: int = 8,
    seed: int = 0,
) -> FinetuneResult:
    """Fine-tune on the best traces (rejection sampling): supervised training of the model in
    ``model`` on the traces rated ``min_reward`` or better (then the best ``top_fraction``).

    Traces whose ids are exact under the model's tokenizer are learned token for token (loss
    on the sampled tokens); the others — another model's traces, e.g. an API model's, as
    distillation — are retokenized from their conversation with the model's chat template
    (``retokenize``, see `agentrl_sdk.production.finetune.sft_examples`); the result counts
    both.

    Args:
        selection: Traces with a reward.
        model: A local ``save_pretrained`` folder (model and tokenizer).
        output_dir: Where the fine-tuned model is written (``final_model`` inside it).
        min_reward: The lowest reward kept.
        top_fraction: The share of the kept traces, best first, to learn from.
        retokenize: ``auto``, ``never`` or ``always``.
        steps: Optimizer steps; ``lr``, ``batch_size``, ``seed``: as in
            `agentrl_sdk.models.supervised_warm_start`.

    Raises:
        ValueError: No trace is left to learn from.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_sdk.models.warm_start import train_on_sft_examples

    tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    best = best_records(selection.records, min_reward=min_reward, top_fraction=top_fraction)
    made = sft_examples(best, tokenizer, retokenize=retokenize)
    if not made.examples:
        raise ValueError(f"no trace to learn from: {len(best)} of {len(selection)} kept by "
                         f"the reward bounds, left out {made.left_out}")
    network = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = train_on_sft_examples(network, made.examples, pad_token_id=pad, steps=steps, lr=lr,
                                   batch_size=batch_size, seed=seed, progress=False)
    final = Path(output_dir) / "final_model"
    network.save_pretrained(final)
    tokenizer.save_pretrained(final)
    learned = sum(sum(mask) for _, mask in made.examples)
    return FinetuneResult(str(final), losses, made.exact, made.retokenized, made.left_out, learned)
