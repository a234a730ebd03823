"""`agentrl train` imports the config's 'module:attr' references from the working directory."""

from __future__ import annotations

import sys

import pytest

from agentrl_sdk.entrypoints import load_object, resolve_entrypoints
from agentrl_sdk.pipeline import TrainConfig


def test_load_object_imports_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_agent_mod.py").write_text("def reward(s, r, t):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_object("my_agent_mod:reward")(None, None, None) == 1.0
    with pytest.raises(ValueError, match="module.path:attribute"):
        load_object("no_colon")
    with pytest.raises(ValueError, match="cannot import"):
        load_object("my_agent_mod:missing")


def test_resolve_needs_graph_and_dataset():
    with pytest.raises(ValueError, match="entrypoint.graph and entrypoint.dataset"):
        resolve_entrypoints(TrainConfig())
