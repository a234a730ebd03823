"""Runs a fully-async job to its last step through SIGKILLs at random moments: each life of the
driver (`tests.faults._crash_driver`) is killed mid-rollout, mid-update, mid-push,
mid-checkpoint (the driver kills itself there) or at a random time (this process kills its
session), then started again with ``checkpoint.resume``; then checks the run
(`tests.faults._crash_ledger`)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.agent import training_rows
from tests.faults import _crash_ledger as ledger
from tests.faults._crash_driver import CHECKPOINT_POINTS, HOOKS
from tests.faults._driver import stop
from tests.pipeline.test_fully_async import _config

KINDS = (*HOOKS, "random")
MAX_FAILURES = 3  # lives in a row that exit with an error before a run is given up
EXPERIMENT = "crash-resume"
ROWS = 24  # of the demo's rows: an epoch is 8 updates of 3 rows


def crash_config(folder: Path, steps: int, ray_address: str | None = None) -> TrainConfig:
    """The fully-async demo job (max_staleness 1, stale groups retried: none is dropped) on
    the demo's first `ROWS` rows (an epoch every 8 updates), checkpointed every update, the
    last two kept, tracked in MLflow without traces; its trainer on the Ray cluster at
    ``ray_address`` (None: one of its own)."""
    config = _config(folder, steps, max_staleness=1, on_stale="retry")
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in training_rows()[:ROWS]))
    config.entrypoint.dataset = str(rows)
    config.checkpoint.dir = str(folder / "ckpt")
    config.checkpoint.every = 1
    config.checkpoint.keep_last = 2
    config.checkpoint.export_final = False
    config.checkpoint.resume = True
    config.tracking.enabled = True
    config.tracking.uri = f"sqlite:///{folder / 'mlflow.db'}"
    config.tracking.experiment = EXPERIMENT
    config.tracking.traces = "off"
    # A tenth of the demo's rate: its policy stays sane (short rollouts) through long runs.
    # A Ray trainer (the pipeline tests' config trains in process): the drivers join a standing
    # cluster, and a killed driver's trainer actor dies with it.
    config.trainer = config.trainer.model_copy(
        update={"placement": "ray", "ray_address": ray_address, "lr": 2e-4})
    return config


def draw_plan(rng: random.Random, life: int, random_kill_s: tuple[float, float]) -> dict:
    """Where life ``life`` dies: a kind of moment, which occurrence of it, how far into it."""
    kind = rng.choice(KINDS)
    if kind == "random":
        return {"life": life, "kind": kind, "after_s": rng.uniform(*random_kill_s)}
    plan = {"life": life, "kind": kind, "nth": rng.randint(1, 3)}
    if kind == "rollout":
        plan |= {"nth": rng.randint(1, 40), "delay_s": rng.uniform(0.0, 0.5)}
    elif kind == "update":
        plan["delay_s"] = rng.uniform(0.0, 1.0)
    elif kind == "push":
        plan["delay_s"] = rng.uniform(0.0, 0.02)
    else:
        plan |= {"point": rng.choice(CHECKPOINT_POINTS), "delay_s": rng.uniform(0.0, 0.3)}
    return plan


@dataclass
class CrashRun:
    """What happened to one run: its lives' plans and ends, and the checks' counts."""

    folder: Path
    steps: int
    lives: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def kills(self) -> int:
        return sum(life["end"] == "killed" for life in self.lives)


def start_driver(folder: Path, config: TrainConfig) -> subprocess.Popen:
    """A driver in a session of its own, importing what it needs, then waiting for its plan
    (`live`); its output appended to driver.log."""
    (folder / "config.json").write_text(config.model_dump_json())
    args = [str(folder / "config.json"), str(folder / "ledger.jsonl")]
    with open(folder / "driver.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "tests.faults._crash_driver", *args],
                                cwd=Path(__file__).parents[2], start_new_session=True,
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)


def live(folder: Path, driver: subprocess.Popen, plan: dict, timeout_s: float) -> dict:
    """Run one life of ``driver`` to its end: killed (by itself or, for a random kill, by us),
    finished, or failed (exited with an error: its log's tail kept)."""
    started = time.perf_counter()
    driver.stdin.write(json.dumps(plan).encode() + b"\n")
    driver.stdin.close()
    try:
        code = driver.wait(timeout=plan.get("after_s", timeout_s))
    except subprocess.TimeoutExpired:
        if plan.get("kind") != "random":
            stop(driver)
            tail = (folder / "driver.log").read_text()[-3000:]
            raise RuntimeError(f"life {plan['life']} ran past {timeout_s} s; its log ends:\n{tail}")
        os.killpg(driver.pid, signal.SIGKILL)
        code = driver.wait()
    stop(driver)  # what a driver that killed itself left in its session (its Ray processes)
    end = {0: "finished", -signal.SIGKILL: "killed"}.get(code, "failed")
    life = {**plan, "end": end, "seconds": round(time.perf_counter() - started, 1)}
    if end == "failed":
        life["log"] = (folder / "driver.log").read_text()[-3000:]
    return life


def crash_run(
    folder: Path,
    steps: int,
    *,
    kills: int,
    rng: random.Random,
    ray_address: str | None = None,
    random_kill_s: tuple[float, float] = (2.0, 30.0),
    timeout_s: float = 600.0,
    plans: tuple[dict, ...] = (),
) -> CrashRun:
    """Train ``steps`` updates in ``folder``, killing the driver at most ``kills`` times
    (fewer when the run reaches its last step first), then check it. The first lives die as
    ``plans`` say (``kind``, ``nth``, ``delay_s``, ``point``, ``after_s``), the others where
    ``rng`` draws."""
    folder.mkdir(parents=True, exist_ok=True)
    config = crash_config(folder, steps, ray_address)
    run = CrashRun(folder, steps)
    spare = start_driver(folder, config)
    try:
        while True:
            life = len(run.lives) + 1
            plan = {"life": life}
            if run.kills < kills:
                drawn = draw_plan(rng, life, random_kill_s)
                plan = {"life": life, **plans[life - 1]} if life <= len(plans) else drawn
            # The next life imports while this one runs: a life's cost is the job's restart.
            driver, spare = spare, start_driver(folder, config)
            run.lives.append(live(folder, driver, plan, timeout_s))
            if run.lives[-1]["end"] == "finished":
                break
            failed = [life for life in run.lives[-MAX_FAILURES:] if life["end"] == "failed"]
            if len(failed) == MAX_FAILURES:  # the job cannot resume: a finding, not a flake
                raise RuntimeError(f"{MAX_FAILURES} lives in a row failed; the last:\n"
                                   f"{failed[-1]['log']}")
    finally:
        stop(spare)
    run.counts = check(run, config)
    return run


def lives_from_ledger(folder: Path) -> list[dict[str, Any]]:
    """The lives of a run in ``folder`` as its ledger tells them (a benchmark that stopped):
    finished, killed by itself, killed at random by the runner, or failed (none of those)."""
    events = ledger.read_ledger(folder / "ledger.jsonl")
    starts = [e for e in events if e["event"] == "start"]
    ends = {e["life"]: e["event"] for e in events if e["event"] in ("kill", "finished", "failed")}
    lives = []
    for start, after in zip(starts, [*starts[1:], None], strict=True):
        plan = start["plan"]
        end = {"kill": "killed", "finished": "finished", "failed": "failed"}.get(
            ends.get(plan["life"], ""))
        if end is None:
            end = "killed" if plan.get("kind") == "random" else "failed"
        seconds = round(after["t"] - start["t"], 1) if after else None
        lives.append({**plan, "end": end, "seconds": seconds, "log": ""})
    return lives


def finish_run(folder: Path, steps: int, timeout_s: float = 600.0) -> CrashRun:
    """A run a stopped benchmark left in ``folder``, resumed once more (if unfinished) to its
    last step, then checked."""
    config = TrainConfig.model_validate_json((folder / "config.json").read_text())
    run = CrashRun(folder, steps, lives=lives_from_ledger(folder))
    if run.lives[-1]["end"] != "finished":
        run.lives.append(live(folder, start_driver(folder, config),
                              {"life": len(run.lives) + 1}, timeout_s))  # fmt: skip
    run.counts = check(run, config)
    return run


def check(run: CrashRun, config: TrainConfig) -> dict[str, Any]:
    """The exactly-once counts of a finished run, and where its kills landed."""
    events = ledger.read_ledger(run.folder / "ledger.jsonl")
    found = ledger.lineage(events, run.steps)
    rows = ledger.row_counts(found.chain, ledger.final_state(run.folder / "ckpt", run.steps),
                             ROWS)  # fmt: skip
    tracked = ledger.mlflow_counts(config.tracking.uri, EXPERIMENT, run.steps)
    chain_lives = Counter(update["life"] for update in found.chain)
    return {
        "steps": run.steps, "lives": len(run.lives), "kills": run.kills,
        "failed_lives": [life["log"][-500:] for life in run.lives if life["end"] == "failed"],
        "kills_by_kind": kill_kinds(run.lives, events),
        "skipped": found.skipped, "duplicated": found.duplicated + rows.pop("duplicated"),
        "lost": rows.pop("lost"), **rows,
        "updates_applied": sum(e["event"] == "update" for e in events),
        "updates_redone": sum(e["event"] == "update" for e in events) - len(found.chain),
        "lives_in_lineage": len(chain_lives),
        "resumes": sum(e["event"] == "load" for e in events),
        "problems": found.problems + ledger.mislabeled_saves(events), **tracked, **ledger.checkpoint_seconds(events),
    }


def kill_kinds(lives: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, int]:
    """Kills by where they landed: ``update``, ``push``, ``rollout`` (inside the operation, or
    ``..._end`` right at its end when it was quicker than the drawn delay), ``checkpoint:POINT``;
    a random kill by what its life had done: ``random:startup`` (no update yet) or
    ``random:training``."""
    hooks = {e["life"]: e for e in events if e["event"] == "kill"}
    trained = {e["life"] for e in events if e["event"] == "update"}
    kinds: Counter[str] = Counter()
    for life in lives:
        if life["end"] != "killed":
            continue
        hook = hooks.get(life["life"])
        if hook is None:
            kinds["random:" + ("training" if life["life"] in trained else "startup")] += 1
        elif hook["kind"] == "checkpoint":
            kinds[f"checkpoint:{hook['point']}"] += 1
        else:
            kinds[hook["kind"] + ("" if hook["inside"] else "_end")] += 1
    return dict(sorted(kinds.items()))


class RayCluster:
    """A standing Ray cluster on this machine (``ray start --head`` in a session of its own),
    for drivers that connect to it (``trainer.ray_address``) instead of starting their own; a
    killed driver's actors die with it, the cluster lives on. Stopped by its session id."""

    def __init__(self, folder: Path, port: int = 6391) -> None:
        self.address = f"127.0.0.1:{port}"
        # Its own temp dir: a plain ray.init() elsewhere on this machine must not find it.
        self.temp = f"/tmp/crash_ray_{os.getpid()}"
        self.log = folder / "ray.log"
        # A head starting while the whole suite runs can time out ("The current node timed out
        # during startup") and exit: it is started again, up to three times, before failing.
        for attempt in range(3):
            self.head = self._start(port)
            if self._up(port, timeout_s=120.0):
                return
            stop(self.head)
            shutil.rmtree(self.temp, ignore_errors=True)
        raise RuntimeError(f"ray start --head did not come up 3 times; see {self.log}")

    def _start(self, port: int) -> subprocess.Popen:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0"}
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                 f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={os.cpu_count()}",
                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.temp}"],
                start_new_session=True, stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip

    def _up(self, port: int, timeout_s: float) -> bool:
        """True once the head listens on its port and still runs ~5 s later (its raylet up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.head.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
            except OSError:
                time.sleep(1.0)
                continue
            time.sleep(5.0)
            return self.head.poll() is None
        return False

    def stop(self) -> None:
        stop(self.head)
        shutil.rmtree(self.temp, ignore_errors=True)
