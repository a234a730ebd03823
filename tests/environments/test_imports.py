"""Importing reasoning-gym or textarena through the SDK leaves the process environment as it
was (their dependencies set OpenMP's KMP_* variables, which engines spawned later inherit)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")

PROGRAM = """
import importlib, os
tasks = importlib.import_module("agentrl_sdk.environments.reasoning_gym")
games = importlib.import_module("agentrl_sdk.environments._textarena_play")
before = dict(os.environ)  # the SDK's own settings made; neither library imported yet
tasks._require()
games.textarena_module()
print(dict(os.environ) == before)
"""


def test_the_libraries_import_without_changing_os_environ():
    env = {"PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True"
