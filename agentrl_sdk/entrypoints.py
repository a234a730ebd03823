"""Resolve the 'module:attr' references of a config into a graph, dataset, reward and model."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.rollout import default_input


@dataclass
class Entrypoints:
    """What `agentrl train` passes to ``sdk.train``."""

    graph: Any
    dataset: Any
    reward: Any
    input_fn: Any
    eval_dataset: Any = None


def load_object(reference: str) -> Any:
    """Import ``module.path:attr`` (the module must be importable from the working directory)."""
    module, _, attr = reference.partition(":")
    if not module or not attr:
        raise ValueError(f"{reference!r} is not of the form 'module.path:attribute'")
    # Like `python -m` (and uvicorn's app dir): the user's project is the working directory.
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {reference!r}: {exc}") from exc


def resolve_entrypoints(config: TrainConfig) -> Entrypoints:
    """Import the entrypoint references and fill ``model.path`` from ``model.builder``."""
    spec = config.entrypoint
    if not spec.graph or not spec.dataset:
        raise ValueError("the config needs entrypoint.graph and entrypoint.dataset for `agentrl train`")
    return Entrypoints(
        graph=resolve_graph(config),
        dataset=load_dataset_reference(spec.dataset),
        reward=load_object(spec.reward) if spec.reward else None,
        input_fn=load_object(spec.input_fn) if spec.input_fn else default_input,
        eval_dataset=load_dataset_reference(spec.eval_dataset) if spec.eval_dataset else None,
    )


def resolve_graph(config: TrainConfig) -> Any:
    """The graph ``entrypoint.graph`` names (a compiled graph, or a function building one),
    with ``model.path`` filled from ``model.builder``: what `agentrl serve` serves."""
    if not config.entrypoint.graph:
        raise ValueError("the config needs entrypoint.graph")
    graph = load_object(config.entrypoint.graph)
    if not hasattr(graph, "ainvoke"):
        graph = graph()
    for model in (config.model, *config.policies.values()):
        if model.path is None and model.builder:
            model.path = str(load_object(model.builder)())
    return graph


def load_dataset_reference(reference: str) -> Any:
    """A dataset reference as ``sdk.train`` takes it: a file path as it is, or the rows a
    'module:function' returns."""
    if ":" in reference and not Path(reference).exists():
        return load_object(reference)()
    return reference
