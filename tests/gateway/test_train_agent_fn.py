"""sdk.train with an OpenAI-speaking agent function: the gateway's trajectories train the policy."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

import agentrl_sdk as sdk
from agentrl_sdk.pipeline import TrainConfig
from tests.engines._tiny import tiny_model_dir

pytestmark = pytest.mark.slow
ROWS = [{"id": f"q{i}", "question": f"Say something about {i}."} for i in range(2)]


@pytest.mark.parametrize("pipeline", ["sync", "fully_async"])
def test_agent_function_trains_through_the_gateway(tmp_path, pipeline):
    posted: list[float] = []

    async def agent(endpoint: sdk.AgentEndpoint, row: dict) -> str:
        client = endpoint.client(max_retries=0, timeout=60)
        messages = [{"role": "user", "content": row["question"]}]
        for _ in range(2):  # two turns: the second extends the first's segment
            reply = await client.chat.completions.create(model=endpoint.model, messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "More."}]
        value = float(len(reply.choices[0].message.content or "") % 3)
        posted.append(value)
        await endpoint.emit_reward(value)
        return reply.choices[0].message.content

    def reward(final_state, row, trajectory):
        assert isinstance(final_state, str) and trajectory.calls  # the agent's return value
        return {"length_bonus": 0.0}

    config = TrainConfig.model_validate({
        "model": {"path": str(tiny_model_dir())},
        "rollout": {"n": 2, "sampling": {"max_tokens": 8, "seed": 0},
                    "chat": {"max_context_tokens": 256}},
        "data": {"batch_size": 2},
        "trainer": {"placement": "in_process", "lr": 0.01},
        "max_steps": 2,
        "checkpoint": {"dir": str(tmp_path / "ckpt")},
        "tracking": {"enabled": False},
        "pipeline": pipeline,  # fully_async rolls out each group through its own gateway
        "fully_async": {"max_staleness": 0},
    })
    result = sdk.train(agent, ROWS, reward, config)

    assert result.steps == 2
    for step, metrics in enumerate(result.history):
        assert metrics["rollouts"] == 4 and metrics["llm_calls/mean"] == 2
        assert metrics["policy_version"] == step + 1
        # It trained, or its batch had no signal (all rewards alike): no optimizer step, counted.
        assert metrics.get("train/trained_tokens", 0) > 0 or metrics["train/skipped_no_signal"] == 1
    # The rewards the agent posted are the rollouts' rewards (the reward fn added 0).
    assert len(posted) == 8
    means = [sum(posted[i:i + 4]) / 4 for i in (0, 4)]
    assert sorted(m["reward/mean"] for m in result.history) == pytest.approx(sorted(means))
    before = load_file(f"{config.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    updated = any(m["train/skipped_no_signal"] == 0 for m in result.history)
    assert updated == any(not (before[k] == after[k]).all() for k in before)

