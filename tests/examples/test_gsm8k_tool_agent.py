"""The GSM8K tool agent: data preparation, the checking tool's lifecycle, and a brief training run."""

from __future__ import annotations

import pytest

from agentrl_sdk.data import load_rows
from agentrl_sdk.pipeline import TrainConfig
from examples.data.make_gsm8k_tool_data import convert, extract_answer, write_sample
from examples.gsm8k_tool_agent.agent import FORMAT_STEP, TOOL_REWARD, build_agents
from examples.gsm8k_tool_agent.train import HERE, run
from tests.pipeline._demo import trainer_in_process


def test_gsm8k_records_become_valid_verl_rows(tmp_path):
    sample = write_sample(tmp_path / "gsm8k.jsonl", count=12, seed=4)
    assert convert(sample, tmp_path / "train.parquet") == 12
    rows, problems = load_rows(tmp_path / "train.parquet", agent_names=set(build_agents()))
    assert problems == [] and len(rows) == 12
    row = rows[0]
    truth = row["reward_model"]["ground_truth"]
    assert truth == extract_answer(row["extra_info"]["answer"])
    assert row["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"] == {
        "ground_truth": truth}
    assert extract_answer("... so 1,234 in all.\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="no '#### N'"):
        extract_answer("no final line")


def test_every_config_validates():
    for name in ("config.yaml", "config_real.yaml", "config_gpu.yaml"):
        TrainConfig.from_yaml(HERE / name)


@pytest.mark.slow
def test_brief_training_run(tmp_path):
    # verl-format rows end to end from a file, as data prep writes them.
    sample = write_sample(tmp_path / "gsm8k.jsonl", count=16, seed=2)
    assert convert(sample, tmp_path / "train.parquet") == 16
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.entrypoint.dataset = str(tmp_path / "train.parquet")
    config.max_steps = 2
    config.data.batch_size = 2  # 2 problems x 8 samples: enough calls of the checking tool
    config.checkpoint.dir = None
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # The example's Ray placement is tests/examples/test_tool_selection.py's subject.
    trainer_in_process(config)

    result = run(config)

    assert [m["policy_version"] for m in result.history] == [1, 2]
    for metrics in result.history:
        assert metrics["rollouts"] == 16
        # Checking-tool instances were created, and every one was released and scored.
        assert metrics["rollout/tools_created"] > 0
        assert metrics["rollout/tools_released"] == metrics["rollout/tools_created"]
        assert 0.0 <= metrics["reward/tool/calc_gsm8k_reward"] <= TOOL_REWARD
        top = 1.0 + TOOL_REWARD + 3 * FORMAT_STEP
        assert -3 * FORMAT_STEP <= metrics["reward/mean"] <= top
