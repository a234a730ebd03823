"""scripts/gen_reference.py --check: passes on current pages, names a stale one and the fix."""

from __future__ import annotations


def test_check_passes_on_the_committed_pages(gen, capsys):
    assert gen.main(["--check"]) == 0
    assert capsys.readouterr().out == ""


def test_check_fails_on_a_stale_page_and_says_how_to_fix_it(gen, monkeypatch, capsys):
    monkeypatch.setitem(gen.PAGES, "metrics.md", lambda: "# Metrics\n\nsomething new\n")
    assert gen.main(["--check"]) == 1
    assert capsys.readouterr().out.strip() == (
        "docs/reference/metrics.md is stale: run python scripts/gen_reference.py"
    )
