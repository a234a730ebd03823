"""The reference generator (scripts/gen_reference.py), loaded from its file: ``scripts`` is
not a package (an installed wheel ships a top-level ``scripts`` that would shadow it)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.docs._helpers import ROOT


@pytest.fixture(scope="session")
def gen():
    """The generator module; its ``_ref_*`` helpers become importable as it loads."""
    path = ROOT / "scripts" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

