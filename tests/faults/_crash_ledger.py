"""The exactly-once checks of a run killed and resumed many times, from the ledger its drivers
wrote (`tests.faults._crash_driver`), its final checkpoint and its MLflow run.

- Updates: the final weights must descend from updates 1..N, each exactly once. Each update
  recorded the digest of the weights before and after it; walking back from the digest of the
  final checkpoint, each step's update must lead to the previous one's, down to the base
  model. Updates a kill discarded (done after their life's last checkpoint) are off this chain;
  they must have been redone, once, by the life that resumed.
- Rows: the groups the chain's updates trained hold no row twice within an epoch, and every
  row drawn from the loader was trained by the chain or is still held (queued, or pending a
  rollout) by the final checkpoint's pipeline state.
- MLflow: the one run, FINISHED, with every step's metrics logged once.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_sdk.pipeline.checkpoints import PIPELINE_STATE
from agentrl_sdk.pipeline.trajectory_queue import PipelineState


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger's events (a line a kill cut short is left out)."""
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class Lineage:
    """The chain of updates the final weights descend from, newest last."""

    chain: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Steps of 1..N the final weights are not shown to descend from (the walk broke)."""
    duplicated: int = 0
    """Updates found on the chain at a step other than their own (applied twice or out of order)."""
    problems: list[str] = field(default_factory=list)


def lineage(events: list[dict[str, Any]], steps: int) -> Lineage:
    """Walk from the final checkpoint's weights back to the base model through the updates."""
    found = Lineage()
    updates = [e for e in events if e["event"] == "update"]
    finals = [e for e in events if e["event"] == "save" and e["step"] == steps]
    bases = {u["before"] for u in updates if u["step"] == 0}
    if not finals or len(bases) != 1:
        found.skipped = steps
        found.problems.append(f"no final save ({len(finals)}) or not one base ({bases})")
        return found
    by_after: dict[str, list[dict[str, Any]]] = {}
    for update in updates:
        by_after.setdefault(update["after"], []).append(update)
    current = finals[-1]["digest"]
    for step in reversed(range(steps)):
        candidates = by_after.get(current, [])
        if not candidates:
            found.skipped = step + 1
            found.problems.append(f"no update led to the weights {current} of step {step + 1}")
            return found
        # Another step's update with the same result is an update that left the weights as
        # they were: only the lack of this step's is a break.
        own = [c for c in candidates if c["step"] == step]
        if not own:
            found.duplicated += 1
            found.problems.append(f"the weights of step {step + 1} came from updates at steps "
                                  f"{sorted({c['step'] for c in candidates})}")
        found.chain.append((own or candidates)[-1])
        current = found.chain[-1]["before"]
    if current not in bases:
        found.problems.append(f"the chain starts at {current}, not the base model {bases}")
        found.skipped = steps
    found.chain.reverse()
    return found


def mislabeled_saves(events: list[dict[str, Any]]) -> list[str]:
    """Checkpoints a life saved under a step before the one it resumed from."""
    loaded = {e["life"]: e["step"] for e in events if e["event"] == "load"}
    return [f"life {e['life']} resumed at step {loaded[e['life']]} saved step {e['step']}"
            for e in events
            if e["event"] == "save" and e["step"] < loaded.get(e["life"], 0)]  # fmt: skip


def row_counts(chain: list[dict[str, Any]], state: PipelineState, rows_per_epoch: int) -> dict:
    """Rows trained twice within an epoch by the chain (or trained and still held), and rows
    drawn but neither trained nor held."""
    trained = [(index, row) for update in chain for index, row in update["groups"]]
    per_epoch = Counter((index // rows_per_epoch, row) for index, row in trained)
    indices = {index for index, _ in trained}
    held = {g.index for g in state.queued} | {p.index for p in state.pending}
    return {
        "trained_groups": len(trained),
        "held_groups": len(held),
        "drawn_rows": state.next_index,
        "epochs": len({epoch for epoch, _ in per_epoch}),
        "duplicated": sum(n - 1 for n in per_epoch.values()) + len(indices & held),
        "lost": len(set(range(state.next_index)) - indices - held),
        "dropped_stale": state.dropped_stale,
        "retried_stale": state.retried_stale,
    }


def final_state(checkpoint_dir: Path, steps: int) -> PipelineState:
    """The pipeline state of the final checkpoint."""
    return PipelineState.model_validate_json(
        (checkpoint_dir / f"step_{steps}" / PIPELINE_STATE).read_text()
    )


def mlflow_counts(tracking_uri: str, experiment: str, steps: int) -> dict:
    """The run(s) of the experiment: how many, the last one's status, its steps logged twice
    (any metric) and not at all (``reward/mean``)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    run = runs[0]
    twice: set[int] = set()
    for key in run.data.metrics:
        logged = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
        twice |= {step for step, n in logged.items() if n > 1}
    rewards = {m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    partial = client.get_metric_history(run.info.run_id, "async/partial_rollouts")
    return {
        "runs": len(runs), "run_id": run.info.run_id, "status": run.info.status,
        "steps_logged_twice": len(twice),
        "steps_not_logged": len(set(range(steps)) - rewards),
        "partial_rollouts": int(sum(m.value for m in partial)),
    }


def checkpoint_seconds(events: list[dict[str, Any]]) -> dict:
    """Median wall time of a checkpoint save (trainer state, pipeline state, manifest) and of
    an update's step without it (from one update to the next within a life, less the save)."""
    saves = [e["seconds"] for e in events if e["event"] == "saved"]
    gaps = []
    previous: dict[int, float] = {}
    saved: dict[int, float] = {}
    for e in events:
        if e["event"] == "saved":
            saved[e["life"]] = saved.get(e["life"], 0.0) + e["seconds"]
        if e["event"] == "update":
            if e["life"] in previous:
                gaps.append(e["t"] - previous[e["life"]] - saved.get(e["life"], 0.0))
            previous[e["life"]], saved[e["life"]] = e["t"], 0.0
    return {"checkpoint_s": statistics.median(saves) if saves else None,
            "step_without_checkpoint_s": statistics.median(gaps) if gaps else None,
            "checkpoints": len(saves), "steps_timed": len(gaps)}
