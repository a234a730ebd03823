"""verl-format rows: they load from parquet as verl writes them, and bad ones name row and field."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl_sdk.data import DatasetError, load_rows


def verl_row(i: int, **changes) -> dict:
    row = {
        "data_source": "openai/gsm8k",
        "agent_name": "tool_agent",
        "prompt": [{"role": "system", "content": "Use the tools."},
                   {"role": "user", "content": f"What is {i} + 1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i, "split": "train", "tools_kwargs": {
            "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": str(i + 1)}}}},
    }
    return row | changes


def test_verl_rows_round_trip_through_parquet(tmp_path):
    rows = [verl_row(i) for i in range(3)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    loaded, problems = load_rows(path, agent_names={"tool_agent"})
    assert problems == []
    assert [r["reward_model"]["ground_truth"] for r in loaded] == ["1", "2", "3"]
    kwargs = loaded[2]["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"]
    assert kwargs == {"ground_truth": "3"}


def test_verl_rows_from_a_hf_dataset_equal_the_dicts():
    from datasets import Dataset

    rows = [verl_row(i) for i in range(3)]
    loaded = load_rows(Dataset.from_list(rows), agent_names={"tool_agent"})
    assert loaded == load_rows(rows, agent_names={"tool_agent"}) == (rows, [])
    rows[1] = verl_row(1, prompt=[{"role": "robot", "content": "hi"}])
    loaded, [problem] = load_rows(Dataset.from_list(rows), agent_names={"tool_agent"})
    assert loaded == [rows[0], rows[2]] and (problem.index, problem.field) == (1, "prompt.0.role")


@pytest.mark.parametrize(("bad", "field", "message"), [
    ({"prompt": []}, "prompt", "at least 1 item"),
    ({"prompt": [{"role": "robot", "content": "hi"}]}, "prompt.0.role", "'system'"),
    ({"prompt": "What is 1 + 1?"}, "prompt", "valid list"),
    ({"reward_model": "42"}, "reward_model", "valid dictionary"),
    ({"extra_info": {"tools_kwargs": {"calc": {"create_kwargs": 5}}}},
     "extra_info.tools_kwargs.calc.create_kwargs", "valid dictionary"),
    ({"agent_name": "other_agent"}, "agent_name", "unknown agent 'other_agent'"),
])
def test_a_bad_row_is_reported_with_index_and_field(bad, field, message):
    rows = [verl_row(0), verl_row(1, **bad), verl_row(2)]
    loaded, [problem] = load_rows(rows, agent_names={"tool_agent"})
    assert [r["extra_info"]["index"] for r in loaded] == [0, 2]
    assert problem.index == 1 and problem.field == field and message in problem.message
    with pytest.raises(DatasetError, match=f"row 1, field '{field}'"):
        load_rows(rows, on_bad_row="raise", agent_names={"tool_agent"})


def test_plain_rows_with_own_keys_pass():
    rows = [{"question": "2+2?", "answer": "4", "id": 9}]
    assert load_rows(rows) == (rows, [])
