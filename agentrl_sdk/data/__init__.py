"""Datasets: rows from dicts, JSONL/parquet files or HF datasets, and a resumable loader."""

from agentrl_sdk.data.loader import LoaderPosition, RowLoader
from agentrl_sdk.data.schema import RowProblem, RowSchema, check_row
from agentrl_sdk.data.sources import DatasetError, DatasetLike, load_rows

__all__ = [
    "DatasetError",
    "DatasetLike",
    "LoaderPosition",
    "RowLoader",
    "RowProblem",
    "RowSchema",
    "check_row",
    "load_rows",
]
