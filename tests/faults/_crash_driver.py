"""A training driver that writes a ledger of what it did and may SIGKILL itself in the middle of
a chosen operation: ``python -m tests.faults._crash_driver CONFIG LEDGER``, then its PLAN as a
line on stdin (it imports what it needs first: a spare driver is ready when its turn comes).

It trains the job in CONFIG (a `TrainConfig` as JSON) and appends to LEDGER (JSON lines) every
event the exactly-once checks (`tests.faults._crash_ledger`) need: each update with its step,
the groups it trained (row index and id) and a digest of the weights before and after it; each
trainer checkpoint saved (the digest of what it saved) and loaded (of what it loaded); each
checkpoint completed (its manifest written).

PLAN (JSON) names this life and, optionally, where it dies: ``kind`` is one of `HOOKS`, ``nth``
the occurrence of that operation in this life, ``delay_s`` how far into it the kill comes (the
end of the operation when it is quicker), ``point`` which file of a checkpoint it precedes.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentrl_sdk.engines.gate import WeightGate
from agentrl_sdk.pipeline import TrainConfig
import agentrl_sdk.pipeline.checkpoints as checkpoints
import agentrl_sdk.pipeline.loop as loop_module
import agentrl_sdk.pipeline.update as update_module
from agentrl_sdk.rollout import row_id_of
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.trainer import TrainerGroup
from agentrl_sdk.trainer.weight_sync import WeightSync
from tests.pipeline._demo import train_demo

HOOKS = ("rollout", "update", "push", "checkpoint")
"""Operations a life may die in: an engine generating, the trainer updating, a weight push,
a checkpoint being written."""

CHECKPOINT_POINTS = ("trainer_state", "pipeline_state", "manifest", "prune")
"""Where in a checkpoint a kill lands: while the trainer writes its state, before the pipeline
state, before the manifest, after the manifest (the checkpoint complete, not yet pruned)."""


def weights_digest(group: TrainerGroup) -> str:
    """sha256 of the trainer's full weights (names and bytes, in name order)."""
    tensors: dict[str, Any] = {}
    for bucket in group.weights.full_state_dict():
        tensors |= {name: t.detach().cpu().contiguous() for name, t in bucket.items()}
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


class Ledger:
    """Appends events to the ledger file, one JSON line each, flushed at once."""

    def __init__(self, path: str, life: int) -> None:
        self.path = path
        self.life = life
        self.lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "life": self.life, "t": time.time(), **fields})
        line += "\n"
        with self.lock, open(self.path, "a") as out:
            out.write(line)


class Killer:
    """Kills this process at the planned moment of the planned operation."""

    def __init__(self, plan: dict[str, Any], ledger: Ledger) -> None:
        self.plan = plan
        self.ledger = ledger
        self.seen = 0
        self.lock = threading.Lock()

    def due(self, kind: str, point: str | None = None) -> bool:
        """Whether this occurrence of ``kind`` (at ``point``) is the one to die in."""
        if self.plan.get("kind") != kind or (point and self.plan.get("point") != point):
            return False
        with self.lock:
            self.seen += 1
            return self.seen == self.plan["nth"]

    def now(self, kind: str, **detail: Any) -> None:
        self.ledger.write("kill", kind=kind, **detail)
        os.kill(os.getpid(), signal.SIGKILL)

    def during(self, kind: str, **detail: Any) -> threading.Timer:
        """A timer that kills ``delay_s`` into the operation; `finish` kills at its end if the
        timer has not fired by then."""
        timer = threading.Timer(self.plan["delay_s"], self.now, (kind,), {"inside": True, **detail})
        timer.daemon = True
        timer.start()
        return timer

    def finish(self, timer: threading.Timer | None, kind: str, **detail: Any) -> None:
        if timer is not None:
            timer.cancel()
            self.now(kind, inside=False, **detail)


def install(ledger: Ledger, killer: Killer) -> None:
    """Wrap the SDK's operations to write the ledger and kill where planned."""
    taken: dict[int, list[tuple[int, str]]] = {}

    take_batch = loop_module._Trainer._take_batch

    async def recording_take_batch(self, step, stop):
        groups, flat = await take_batch(self, step, stop)
        taken[step] = [(g.index, row_id_of(g.row)) for g, _credit in groups + flat]
        return groups, flat

    update = update_module.update_policy

    async def recording_update(policy, step, samples):
        before = await run_blocking(weights_digest, policy.group)
        timer = killer.during("update") if killer.due("update") else None
        metrics = await update(policy, step, samples)
        killer.finish(timer, "update")
        after = await run_blocking(weights_digest, policy.group)
        ledger.write("update", step=step, before=before, after=after, groups=taken.get(step),
                     samples=len(samples))
        return metrics

    generate = WeightGate.generate

    async def killing_generate(self, *args, **kwargs):
        timer = killer.during("rollout") if killer.due("rollout") else None
        result = await generate(self, *args, **kwargs)
        killer.finish(timer, "rollout")
        return result

    push = WeightSync.push

    async def killing_push(self, source, engines, version):
        timer = killer.during("push", step=version) if killer.due("push") else None
        stats = await push(self, source, engines, version)
        killer.finish(timer, "push", step=version)
        return stats

    save, load = TrainerGroup.save_checkpoint, TrainerGroup.load_checkpoint

    def recording_save(self, path, extra=None, adapter=None):
        digest, step = weights_digest(self), (extra or {}).get("step")
        timer = None
        if killer.due("checkpoint", "trainer_state"):
            timer = killer.during("checkpoint", point="trainer_state", step=step)
        save(self, path, extra, adapter)
        killer.finish(timer, "checkpoint", point="trainer_state", step=step)
        ledger.write("save", step=step, digest=digest)

    def recording_load(self, path, adapter=None):
        extra = load(self, path, adapter)
        ledger.write("load", step=extra.get("step"), digest=weights_digest(self))
        return extra

    write = checkpoints._write_atomic

    def killing_write(path: Path, data: bytes) -> None:
        if not path.parent.name.startswith("step_"):
            return write(path, data)
        step = int(path.parent.name[5:])
        if path.name == checkpoints.PIPELINE_STATE and killer.due("checkpoint", "pipeline_state"):
            killer.now("checkpoint", point="pipeline_state", step=step)
        if path.name == checkpoints.MANIFEST and killer.due("checkpoint", "manifest"):
            killer.now("checkpoint", point="manifest", step=step)
        write(path, data)
        if path.name == checkpoints.MANIFEST:
            ledger.write("complete", step=step)
            if killer.due("checkpoint", "prune"):
                killer.now("checkpoint", point="prune", step=step)

    save_all = loop_module.save_checkpoint

    async def timed_save(job, step, *args, **kwargs):
        started = time.perf_counter()
        folder = await save_all(job, step, *args, **kwargs)
        ledger.write("saved", step=step, seconds=time.perf_counter() - started)
        return folder

    loop_module.save_checkpoint = timed_save
    loop_module._Trainer._take_batch = recording_take_batch
    update_module.update_policy = recording_update
    WeightGate.generate = killing_generate
    WeightSync.push = killing_push
    TrainerGroup.save_checkpoint = recording_save
    TrainerGroup.load_checkpoint = recording_load
    checkpoints._write_atomic = killing_write


def _import_ahead() -> None:
    """What the job imports on the way (a spare driver does it before its turn)."""
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import ray  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import agentrl_sdk.engines.torch.engine  # noqa: F401
    import examples.tool_selection.model  # noqa: F401


def main(config_path: str, ledger_path: str) -> None:
    _import_ahead()
    plan = json.loads(sys.stdin.readline())  # its imports done, the driver waits for its turn
    config = TrainConfig.model_validate_json(Path(config_path).read_text())
    ledger = Ledger(ledger_path, plan["life"])
    ledger.write("start", pid=os.getpid(), plan=plan)
    install(ledger, Killer(plan, ledger))
    try:
        result = train_demo(config)
    except BaseException as exc:
        ledger.write("failed", error=repr(exc)[:300])
        raise
    ledger.write("finished", steps=result.steps, run_id=result.run_id)


if __name__ == "__main__":
    main(*sys.argv[1:3])
