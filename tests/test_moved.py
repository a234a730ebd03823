"""Modules that moved keep importing under their former names, as the same module, with a
warning; a TrainerGroup's former weight methods name their new place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_sdk._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]


def test_former_module_paths_are_the_new_modules_with_a_warning():
    # A fresh interpreter, where no former name is in sys.modules yet.
    script = (
        "import warnings, importlib\n"
        "from agentrl_sdk._moved import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        former = importlib.import_module(old)\n"
        "    assert former is importlib.import_module(new), (old, former)\n"
        "    assert former.__spec__.name == new, former.__spec__.name\n"
        "    print(*[w.message for w in caught if w.category is DeprecationWarning])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for old, new in MOVED.items():
        assert f"{old} moved to {new}; import it from there" in done.stdout
        # the finder answers the former name, never a file left behind
        assert not Path(ROOT, *old.split(".")).with_suffix(".py").exists()


def test_a_trainer_groups_former_weight_method_says_where_it_went():
    from agentrl_sdk.trainer.group import TrainerGroup

    group = object.__new__(TrainerGroup)  # no ranks: only the attribute lookup
    with pytest.raises(AttributeError, match=r"TrainerGroup.stage_weights is now group.weights.stage"):
        group.stage_weights()
    with pytest.raises(AttributeError, match="no attribute 'nothing_like_it'"):
        group.nothing_like_it
