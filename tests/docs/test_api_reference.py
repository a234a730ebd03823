"""docs/reference/api.md: every export of ``agentrl_sdk`` documented, every entry importable."""

from __future__ import annotations

import importlib
import re

import pytest

import agentrl_sdk
from tests.docs._helpers import ROOT, assert_fresh


def test_page_is_current(gen):
    assert_fresh(gen, "api.md")


def test_every_export_appears_in_the_docs():
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    missing = [name for name in agentrl_sdk.__all__
               if not re.search(rf"\b(agentrl_sdk|sdk)\.{re.escape(name)}\b", text)]
    assert not missing, f"exports named nowhere in docs/: {missing}"


def test_every_entry_resolves_to_an_object():
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    entries = re.findall(r"^::: (\S+)$", page, flags=re.M)
    assert len(entries) >= len(agentrl_sdk.__all__)
    for dotted in entries:
        module, _, name = dotted.rpartition(".")
        try:
            obj = importlib.import_module(dotted)
        except ImportError:
            obj = getattr(importlib.import_module(module), name, None)
        assert obj is not None, f"api.md: {dotted} is not importable"


def test_an_export_left_out_of_every_group_is_refused(gen, monkeypatch):
    import _ref_api

    monkeypatch.setattr(agentrl_sdk, "__all__", [*agentrl_sdk.__all__, "brand_new"])
    with pytest.raises(ValueError, match="brand_new"):
        _ref_api.render(agentrl_sdk)
