"""Load dataset rows from what users have: dicts, JSONL or parquet files, HF datasets."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DatasetLike = Iterable[Mapping[str, Any]] | str | Path
"""Any iterable of dict rows, a ``.jsonl``/``.json``/``.parquet`` path, or a HF ``Dataset``."""


class DatasetError(ValueError):
    """A dataset could not be read at all (a bad single row is skipped and counted instead)."""


def load_rows(dataset: DatasetLike) -> tuple[list[dict[str, Any]], int]:
    """Materialise ``dataset`` as a list of dict rows.

    Returns:
        The rows and how many entries were skipped because they were not mappings (each
        skip is logged with its index).
    """
    if isinstance(dataset, str | Path):
        raw = _read_path(Path(dataset))
    elif hasattr(dataset, "to_list") and hasattr(dataset, "features"):  # datasets.Dataset
        raw = dataset.to_list()
    else:
        raw = list(dataset)
    rows, skipped = [], 0
    for index, row in enumerate(raw):
        if isinstance(row, Mapping):
            rows.append(dict(row))
        else:
            skipped += 1
            logger.warning("dataset row %d is a %s, not a mapping: skipped", index, type(row).__name__)
    if not rows:
        raise DatasetError(f"the dataset has no usable rows ({skipped} skipped)")
    return rows, skipped


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
                logger.warning("%s line %d is not JSON (%s): skipped", path, number, exc.msg)
                rows.append(None)
        return rows
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else [data]
    raise DatasetError(f"unsupported dataset file {path}: use .jsonl, .json or .parquet")
