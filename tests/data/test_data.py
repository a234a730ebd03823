"""Dataset loading from every supported source, and the resumable row loader."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl_sdk.data import DatasetError, LoaderPosition, RowLoader, load_rows

ROWS = [{"id": str(i), "q": f"question {i}"} for i in range(5)]


def test_sources_agree(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\nnot json\n")
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    assert load_rows(ROWS) == (ROWS, [])
    rows, [problem] = load_rows(jsonl)  # the bad line is skipped and reported
    assert rows == ROWS and str(problem) == "row 5, field '(row)': line 7 is not JSON: " \
        "Expecting value"
    assert load_rows(str(parquet)) == (ROWS, [])
    rows, [problem] = load_rows(iter([*ROWS, 7]))
    assert rows == ROWS and problem.index == 5 and "must be a mapping" in problem.message


def test_hf_dataset_gives_the_rows_dicts_give():
    from datasets import Dataset

    assert load_rows(Dataset.from_list(ROWS)) == load_rows(ROWS) == (ROWS, [])


def test_unusable_datasets_say_why(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unsupported"):
        load_rows(tmp_path / "x.csv")
    with pytest.raises(DatasetError, match="no usable rows"):
        load_rows([1, 2])


def test_loader_is_seeded_epoch_based_and_resumable():
    loader = RowLoader(ROWS, 2, seed=3)
    batches = [[r["id"] for r in loader.next_batch()] for _ in range(5)]
    assert all(len(b) == 2 for b in batches)
    # Each epoch covers 4 of the 5 rows without repeats.
    assert len(set(batches[0] + batches[1])) == 4
    again = RowLoader(ROWS, 2, seed=3)
    again.position = LoaderPosition(epoch=1, index=2)
    assert [r["id"] for r in again.next_batch()] == batches[3]
    with pytest.raises(ValueError, match="larger than the dataset"):
        RowLoader(ROWS, 6)
