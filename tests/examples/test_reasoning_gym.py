"""The reasoning-gym example: its YAML factories, its warm start's demonstrations, and two
updates of SmolLM2 on the task's own verifier."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

pytest.importorskip("reasoning_gym")

from agentrl_sdk.entrypoints import load_dataset_reference, load_object  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from examples.reasoning_gym import agent  # noqa: E402
from examples.reasoning_gym.model import demonstrations  # noqa: E402

CONFIG = Path("examples/reasoning_gym/config.yaml")
COMPONENT = f"reasoning_gym/{agent.TASK}"


def test_the_config_names_module_level_factories_that_resolve():
    config = TrainConfig.from_yaml(CONFIG)
    spec = config.entrypoint
    rows = load_dataset_reference(spec.dataset)
    held_out = load_dataset_reference(spec.eval_dataset)
    assert len(held_out) == agent.HELD_OUT_ROWS and len(rows) > 1500
    questions = {r["messages"][-1]["content"] for r in rows}
    assert not questions & {r["messages"][-1]["content"] for r in held_out}
    graph = load_object(spec.graph)()
    assert hasattr(graph, "ainvoke")
    reward = load_object(spec.reward)
    row = held_out[0]
    answer = row["reasoning_gym"]["entry"]["answer"]
    right = {"messages": [HumanMessage("q"), AIMessage(f"<answer>{answer}</answer>")]}
    assert reward(right, row, None) == {COMPONENT: 1.0}
    assert reward({"messages": [AIMessage(f"{answer}")]}, row, None) == {COMPONENT: 0.0}
    assert config.model.builder == "examples.reasoning_gym.model:model_path"
    assert config.evaluation.every == 8 and config.trainer.trainable_layers == 6


def test_the_warm_start_shows_the_answer_format_and_never_a_held_out_question():
    shown = demonstrations(agent.TASK, agent.CONFIG, 256, (agent.HELD_OUT_SEED,
                                                           agent.HELD_OUT_ROWS))
    held_out = {r["messages"][-1]["content"] for r in agent.held_out_rows()}
    assert 200 < len(shown) <= 256
    assert not {d[1]["content"] for d in shown} & held_out
    for conversation in shown:
        assert [m["role"] for m in conversation] == ["system", "user", "assistant"]
        assert conversation[2]["content"].startswith("<answer>")
        assert conversation[2]["content"].endswith("</answer>")


@pytest.mark.slow
def test_two_updates_of_the_warm_started_model_on_the_tasks_verifier(tmp_path):
    import agentrl_sdk as sdk
    from agentrl_sdk.entrypoints import resolve_entrypoints

    config = TrainConfig.from_yaml(CONFIG)
    config.max_steps, config.data.batch_size, config.rollout.n = 2, 4, 4
    config.evaluation.every, config.checkpoint.dir = 0, None
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = resolve_entrypoints(config)  # builds (once) the warm start
    result = sdk.train(job.graph, job.dataset, reward=job.reward, config=config)
    assert [m["policy_version"] for m in result.history] == [1, 2]
    rewards = [m[f"reward/{COMPONENT}"] for m in result.history]
    # The warm-started policy writes the tag and solves some questions, not all of them.
    assert 0.0 < sum(rewards) / len(rewards) < 1.0, rewards
    assert all(m.get("count/reward_errors", 0) == 0 for m in result.history)  # logged when > 0
    assert any(not m["train/skipped_no_signal"] for m in result.history)
