"""Finding traces in MLflow: a filter string from times and tags, pages of traces.

The filter is MLflow's own trace search language (``mlflow.search_traces``: clauses joined by
``AND``, no parentheses); the times and tags given as arguments are added to it with ``AND``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from agentrl_sdk.tracing.view import filter_literal

__all__ = ["TimeBound", "search_filter", "search_pages"]

TimeBound = datetime | int | float | None
"""A time bound: a ``datetime`` (naive ones are local time), or milliseconds since the epoch."""

PAGE_SIZE = 100
"""Traces fetched per request."""


def search_filter(
    *,
    start: TimeBound = None,
    end: TimeBound = None,
    tags: Mapping[str, str] | None = None,
    filter_string: str | None = None,
) -> str | None:
    """One MLflow trace filter: ``filter_string``, the request time in ``[start, end)`` and
    each tag equal to its value, joined with ``AND``; None when there is nothing to filter.

    Raises:
        ValueError: ``end`` is not after ``start``, or a tag value holds both quotes.
    """
    lo, hi = _ms(start), _ms(end)
    if lo is not None and hi is not None and hi <= lo:
        raise ValueError(f"end ({end}) must be after start ({start})")
    clauses = [filter_string.strip()] if filter_string and filter_string.strip() else []
    if lo is not None:
        clauses.append(f"timestamp_ms >= {lo}")
    if hi is not None:
        clauses.append(f"timestamp_ms < {hi}")
    for key, value in (tags or {}).items():
        name = key if key.replace("_", "").isalnum() else f"`{key}`"
        clauses.append(f"tags.{name} = {filter_literal(value)}")
    return " AND ".join(clauses) or None


def search_pages(
    client: Any, locations: list[str], filter_string: str | None, limit: int | None
) -> Iterator[Any]:
    """Traces with their spans, newest first, page by page, at most ``limit`` (all if None)."""
    token, seen = None, 0
    while limit is None or seen < limit:
        size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - seen)
        page = client.search_traces(
            locations=locations, filter_string=filter_string, max_results=size,
            order_by=["timestamp_ms DESC"], page_token=token, include_spans=True,
        )
        yield from page
        seen += len(page)
        token = page.token
        if not token or not page:
            return


def _ms(bound: TimeBound) -> int | None:
    if bound is None:
        return None
    if isinstance(bound, datetime):
        return int(bound.timestamp() * 1000)
    return int(bound)
