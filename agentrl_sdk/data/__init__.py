"""Datasets: rows from dicts, JSONL/parquet files or HF datasets, and a resumable loader."""

from agentrl_sdk.data.graph_input import GraphInputCheck
from agentrl_sdk.data.loader import LoaderPosition, RowLoader
from agentrl_sdk.data.schema import RowCheck, RowProblem, RowSchema, check_row
from agentrl_sdk.data.sources import DatasetError, DatasetLike, load_rows

__all__ = [
    "DatasetError",
    "DatasetLike",
    "GraphInputCheck",
    "LoaderPosition",
    "RowCheck",
    "RowLoader",
    "RowProblem",
    "RowSchema",
    "check_row",
    "load_rows",
]
