"""Helpers of the docs tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def assert_fresh(gen, page: str) -> None:
    """The committed page is what the generator writes now."""
    committed = (ROOT / "docs" / "reference" / page).read_text(encoding="utf-8")
    assert committed == gen.PAGES[page](), (
        f"docs/reference/{page} is stale: run python scripts/gen_reference.py"
    )
