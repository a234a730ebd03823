"""`cached_build`: one build per recipe, atomic, and optionally in a process of its own."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import pytest

from agentrl_sdk.models import cached_build


def _write_pid(folder: Path, tag: str = "") -> None:
    (folder / "config.json").write_text(f'{{"pid": {os.getpid()}, "tag": "{tag}"}}')


def _fail(folder: Path) -> None:
    raise RuntimeError("the warm start diverged")


def _hang(folder: Path) -> None:
    time.sleep(600)


def _die(folder: Path) -> None:
    os._exit(3)  # as the OOM killer would leave it: no exception, no result


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))


def test_a_recipe_is_built_once_and_a_new_recipe_builds_anew():
    calls = []

    def build(folder):
        calls.append(folder.name)
        _write_pid(folder)

    first = cached_build("m", {"lr": 1}, build)
    assert cached_build("m", {"lr": 1}, build) == first and len(calls) == 1
    assert cached_build("m", {"lr": 2}, build) != first and len(calls) == 2
    # Only the models are left in the cache: no partial build, no lock file beside them.
    second = cached_build("m", {"lr": 2}, build)
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([".locks", first.name,
                                                                    second.name])


def test_an_isolated_build_runs_in_another_process():
    folder = cached_build("m", {"x": 1}, partial(_write_pid, tag="child"), isolated=True)
    written = (folder / "config.json").read_text()
    assert '"tag": "child"' in written and f'"pid": {os.getpid()},' not in written


def test_an_isolated_build_refuses_a_lambda_and_raises_the_childs_error(tmp_path):
    with pytest.raises(TypeError, match="picklable build"):
        cached_build("m", {"x": 2}, lambda folder: _write_pid(folder), isolated=True)
    with pytest.raises(RuntimeError, match="diverged"):
        cached_build("m", {"x": 3}, _fail, isolated=True)
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob("m-*/config.json"))


def test_an_isolated_build_that_hangs_or_dies_is_reported_not_waited_on():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="ran over 20 s"):
        cached_build("m", {"x": 4}, _hang, isolated=True, timeout_s=20)
    assert time.monotonic() - started < 60
    with pytest.raises(RuntimeError, match=r"died \(exit code 3\)"):
        cached_build("m", {"x": 5}, _die, isolated=True)


def _count_and_write(folder: Path, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"{os.getpid()}\n")
    time.sleep(2.0)  # long enough that the other process asks while this one builds
    _write_pid(folder)


def _build_for(root: str, log: str) -> None:
    os.environ["AGENTRL_CACHE"] = root
    cached_build("m", {"x": 9}, partial(_count_and_write, log=Path(log)))


def test_two_processes_asking_at_once_build_the_recipe_once(tmp_path):
    import multiprocessing

    log = tmp_path / "builds.log"
    other = multiprocessing.get_context("spawn").Process(target=_build_for,
                                                         args=(str(tmp_path), str(log)))
    other.start()
    deadline = time.monotonic() + 60
    while not log.exists():  # the other process is building now
        assert time.monotonic() < deadline and other.is_alive()
        time.sleep(0.05)
    folder = cached_build("m", {"x": 9}, partial(_count_and_write, log=log))
    other.join(60)
    assert other.exitcode == 0
    assert len(log.read_text().split()) == 1  # one build: this caller waited for the other's
    assert '"pid"' in (folder / "config.json").read_text()
