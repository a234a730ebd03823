"""Load dataset rows from what users have: dicts, JSONL or parquet files, HF datasets."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from agentrl_sdk.data.schema import RowCheck, RowProblem, check_row

logger = logging.getLogger(__name__)

DatasetLike = Iterable[Mapping[str, Any]] | str | Path
"""Any iterable of dict rows, a ``.jsonl``/``.json``/``.parquet`` path, or a HF ``Dataset``."""


class DatasetError(ValueError):
    """A dataset could not be read at all (a bad single row is skipped and counted instead)."""


def load_rows(
    dataset: DatasetLike,
    *,
    on_bad_row: Literal["skip", "raise"] = "skip",
    agent_names: Collection[str] | None = None,
    input_check: RowCheck | None = None,
) -> tuple[list[dict[str, Any]], list[RowProblem]]:
    """Materialise ``dataset`` as a list of validated dict rows.

    Each row is checked against `RowSchema` (verl's fields, when present, must have their
    shape; other keys pass through), with ``agent_names`` its ``agent_name``, and with
    ``input_check`` whether it gives the graph an input it can run on.

    Args:
        dataset: Rows, a file path, or a HF dataset.
        on_bad_row: ``skip`` logs and leaves out a bad row; ``raise`` fails on the first one.
        agent_names: The agents the job can run (None: any).
        input_check: Run on each schema-valid row (see `GraphInputCheck`).

    Returns:
        The good rows, and one `RowProblem` (index, field, message) per row left out.

    Raises:
        DatasetError: The dataset cannot be read, has no good row, or (with
            ``on_bad_row="raise"``) has a bad one.
    """
    if isinstance(dataset, str | Path):
        raw = _read_path(Path(dataset))
    elif hasattr(dataset, "to_list") and hasattr(dataset, "features"):  # datasets.Dataset
        raw = dataset.to_list()
    else:
        raw = list(dataset)
    rows: list[dict[str, Any]] = []
    problems: list[RowProblem] = []
    for index, row in enumerate(raw):
        if isinstance(row, _NotJSON):
            problem = RowProblem(index=index, field="(row)", message=str(row))
        else:
            problem = check_row(row, index, agent_names)
            if problem is None and input_check is not None:
                problem = input_check(row, index)
        if problem is None:
            rows.append(dict(row))
            continue
        problem = problem.model_copy(update={"row_id": own_row_id(row)})
        if on_bad_row == "raise":
            raise DatasetError(f"bad dataset row: {problem}")
        problems.append(problem)
        logger.warning("dataset %s: skipped", problem)
    if not rows:
        first = f"; first: {problems[0]}" if problems else ""
        raise DatasetError(f"the dataset has no usable rows ({len(problems)} skipped{first})")
    return rows, problems


def own_row_id(row: Any) -> str | None:
    """The id a row gives itself (``id``, ``row_id`` or ``uid``), or None."""
    if isinstance(row, Mapping):
        for key in ("id", "row_id", "uid"):
            if key in row:
                return str(row[key])
    return None


class _NotJSON(str):
    """A JSONL line that did not parse: kept in place so row indices stay right."""


def _read_path(path: Path) -> list[Any]:
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                rows.append(_NotJSON(f"line {number} is not JSON: {exc.msg}"))
        return rows
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else [data]
    raise DatasetError(f"unsupported dataset file {path}: use .jsonl, .json or .parquet")
