"""Evaluation on held-out rows: `sdk.evaluate` alone, and `evaluation.every` during training."""

from __future__ import annotations

import mlflow
import pytest

import agentrl_sdk as sdk
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models import load_pretrained_pair
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.tracing import load_trace_view, search_rollout_traces
from examples.calculator.agent import build_graph, make_rows
from examples.calculator.reward import calculator_reward
from examples.tool_selection.agent import build_graph as build_tool_graph
from examples.tool_selection.agent import graph_input, make_rows as tool_rows, right_tool_reward
from examples.tool_selection.train import HERE
from tests.gateway.conftest import CALC_ROWS, calc_model_dir
from tests.pipeline._demo import trainer_in_process

pytestmark = pytest.mark.slow
UNSEEN = make_rows(4, seed=11)  # questions the calculator policy was not warm-started on


def _calc_config(tmp_path) -> TrainConfig:
    return TrainConfig.model_validate({
        "model": {"path": str(calc_model_dir())},
        "rollout": {"sampling": {"temperature": 1.0, "max_tokens": 48}},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "eval"},
    })  # fmt: skip


def test_evaluate_is_greedy_token_exact_and_logged(tmp_path, qwen_tokenizer):
    config = _calc_config(tmp_path)
    rows = CALC_ROWS + UNSEEN
    result = sdk.evaluate(build_graph(), rows, calculator_reward, config)

    trajectories = result.trajectories
    assert [t.row_id for t in trajectories] == [r["id"] for r in rows]
    m = result.metrics
    assert m["rollouts"] == m["rows"] == 8.0
    assert m["reward/mean"] == pytest.approx(sum(t.reward for t in trajectories) / 8)
    assert m["pass_at_1"] == pytest.approx(sum(t.reward >= 1.0 for t in trajectories) / 8)
    # The rows it was warm-started on are solved in three tool-using turns.
    assert [t.reward for t in trajectories[:4]] == [1.0] * 4
    assert m["reward/answer"] == pytest.approx(sum(t.rewards["answer"] for t in trajectories) / 8)

    # Greedy by default (the training sampling's temperature 1 is not used): the same ids as
    # rollouts on a TorchEngine with temperature 0.
    model, _ = load_pretrained_pair(calc_model_dir())
    engine = TorchEngine(model)
    try:
        greedy = config.evaluation.rollout(config.rollout)
        assert greedy.sampling.temperature == 0.0
        reference = await_rollouts(rows, engine, qwen_tokenizer, greedy)
    finally:
        engine.close()
    for ours, ref in zip(trajectories, reference, strict=True):
        assert [c.response_ids for c in ours.calls] == [c.response_ids for c in ref.calls]
        assert ours.segments[0].response_mask == ref.segments[0].response_mask

    # Its own MLflow run: eval/ metrics at step 0; rollouts that failed are traced as eval.
    client = mlflow.MlflowClient(config.tracking.uri)
    logged = client.get_run(result.run_id).data.metrics
    assert logged["eval/reward/mean"] == pytest.approx(m["reward/mean"])
    assert logged["eval/pass_at_1"] == pytest.approx(m["pass_at_1"])
    failed = [t for t in trajectories if t.status != "ok"]
    traced = search_rollout_traces(config.tracking.uri, run_id=result.run_id, phase="eval")
    assert len(traced) == len(failed)


def await_rollouts(rows, engine, tokenizer, config):
    import asyncio

    return asyncio.run(sdk.arollout_batch(build_graph(), rows, engine, tokenizer=tokenizer,
                                          config=config))


def test_evaluating_no_rows_says_so(tmp_path):
    config = _calc_config(tmp_path)
    with pytest.raises(ValueError, match="no usable rows"):
        sdk.evaluate(build_graph(), [], calculator_reward, config)


@pytest.mark.parametrize("pipeline", ["sync", "fully_async"])
def test_training_evaluates_held_out_rows_on_schedule(tmp_path, pipeline, monkeypatch):
    from agentrl_sdk.pipeline import evaluate
    from agentrl_sdk.engines.gate import WeightGate
    from examples.tool_selection.model import model_path

    # Whether a training rollout's call got past its gate while an evaluation ran.
    evaluating, passed = [False], []
    rollout_batch, generate = evaluate.arollout_batch, WeightGate.generate

    async def timed_evaluation(*args, **kwargs):
        evaluating[0] = True
        try:
            return await rollout_batch(*args, **kwargs)
        finally:
            evaluating[0] = False

    async def watched_generate(self, *args, **kwargs):
        await self._open.wait()
        passed.append(evaluating[0])
        return await generate(self, *args, **kwargs)

    monkeypatch.setattr(evaluate, "arollout_batch", timed_evaluation)
    monkeypatch.setattr(WeightGate, "generate", watched_generate)

    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.model.path = str(model_path())
    # The trainer in this process: the schedule, gates and traces checked here are the
    # pipeline's, wherever the rank runs; this skips starting Ray and a trainer actor (~15 s).
    trainer_in_process(config)
    config.pipeline = pipeline
    config.max_steps = 3
    config.data.batch_size = 2
    config.rollout.n = 4
    config.checkpoint.dir = None
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "all"
    config.evaluation.every = 2
    config.evaluation.traces = "all"
    held_out = tool_rows(6, seed=99)

    result = sdk.train(build_tool_graph(), tool_rows(32, seed=2), right_tool_reward, config,
                       input_fn=graph_input, eval_dataset=held_out)

    # Before training, every 2 updates, and after the last one; the gates held training
    # rollouts back meanwhile (the evaluation's calls go past them).
    assert [e.step for e in result.evaluations] == [0, 2, 3]
    assert passed and not any(passed)
    for evaluation in result.evaluations:
        assert evaluation.metrics["rows"] == 6.0 and evaluation.trajectories == []
    uri, run_id = config.tracking.uri, result.run_id
    history = mlflow.MlflowClient(uri).get_metric_history(run_id, "eval/reward/mean")
    assert [(h.step, h.value) for h in history] == [
        (e.step, pytest.approx(e.metrics["reward/mean"])) for e in result.evaluations]
    # Eval traces are apart from the training ones, each sampled by the weights it evaluated.
    for evaluation in result.evaluations:
        infos = search_rollout_traces(uri, run_id=run_id, step=evaluation.step, phase="eval")
        assert len(infos) == 6
        for info in infos:
            view = load_trace_view(uri, info.trace_id)
            if view.root["status"] == "ok":
                assert view.root["policy_versions"] == [evaluation.step]
    assert len(search_rollout_traces(uri, run_id=run_id, step=0, phase="train")) == 8

    # The starting weights' evaluation is what `sdk.evaluate` finds for them (greedy).
    alone = sdk.evaluate(build_tool_graph(), held_out, right_tool_reward, config,
                         input_fn=graph_input)
    assert alone.metrics["reward/mean"] == result.evaluations[0].metrics["reward/mean"]
    assert alone.metrics["pass_at_1"] == result.evaluations[0].metrics["pass_at_1"]


def test_evaluation_every_needs_an_eval_dataset():
    config = TrainConfig.model_validate({"evaluation": {"every": 1}})
    with pytest.raises(ValueError, match="no eval_dataset"):
        sdk.train(build_tool_graph(), tool_rows(4), right_tool_reward, config)
