"""Engines users wrote: fitted to the call the chat model makes, or refused before a rollout.

The chat model calls ``engine.generate(prompt_ids, sampling, request_id, session_id=...)``.
``session_id`` came after the first release: an engine written against the three-argument
``generate`` of the README of that time keeps working (it is called without it; a pool's
session routing is what it misses), and an object with no usable ``generate`` is refused when
the rollouts start, with the signature to write, instead of failing inside every rollout.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine

__all__ = ["SessionlessEngine", "fit_engine", "fit_engines"]

GENERATE = ("async def generate(self, prompt_ids: list[int], sampling: SamplingParams, "
            "request_id: str, *, session_id: str | None = None) -> GenerateResult")


class SessionlessEngine:
    """An engine whose ``generate`` takes no ``session_id``: called without it. Everything
    else (``policy_version``, ``load_weights``, ``health``, ...) is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(
        self, prompt_ids: list[int], sampling: Any, request_id: str, *,
        session_id: str | None = None,
    ) -> Any:
        return await self.engine.generate(prompt_ids, sampling, request_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def fit_engine(engine: Engine) -> Engine:
    """``engine``, or a `SessionlessEngine` around it when its ``generate`` has no
    ``session_id``.

    Raises:
        TypeError: ``engine`` has no ``generate`` taking ``(prompt_ids, sampling,
            request_id)``; the message gives the signature to write.
    """
    generate = getattr(engine, "generate", None)
    if not callable(generate):
        raise TypeError(f"{type(engine).__name__} is not an engine: it has no generate(); "
                        f"an engine needs `{GENERATE}` (see the README's 'Bring your own "
                        "engine')")
    declared = getattr(type(engine), "generate", None)
    # Read (and cache) the class's function; an instance attribute is read each time.
    takes = _method_takes(declared) if inspect.isfunction(declared) else _takes(generate)
    if takes is None:  # no signature to read (a C extension, a mock): trust it
        return engine
    positional, session = takes
    if positional < 3:
        raise TypeError(f"{type(engine).__name__}.generate takes {positional} positional "
                        f"arguments; an engine needs `{GENERATE}`")
    return engine if session else SessionlessEngine(engine)  # type: ignore[return-value]


def fit_engines(engines: Engine | Mapping[str, Engine]) -> Engine | Mapping[str, Engine]:
    """`fit_engine` on one engine or on each engine of a mapping by policy."""
    if isinstance(engines, Mapping):
        fitted = {name: fit_engine(engine) for name, engine in engines.items()}
        return engines if all(fitted[k] is engines[k] for k in fitted) else fitted
    return fit_engine(engines)


@functools.lru_cache(maxsize=256)
def _method_takes(function: Any) -> tuple[int, bool] | None:
    """`_takes` of a method's function, its ``self`` left out."""
    return _takes(function, skip=1)


def _takes(generate: Any, skip: int = 0) -> tuple[int, bool] | None:
    """(positional parameters, whether ``session_id`` is accepted), or None: unreadable."""
    try:
        parameters = list(inspect.signature(generate).parameters.values())[skip:]
    except (TypeError, ValueError):
        return None
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        positional = 3
    else:
        positional = sum(k in (inspect.Parameter.POSITIONAL_ONLY,
                               inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    session = inspect.Parameter.VAR_KEYWORD in kinds or any(
        p.name == "session_id" and p.kind is not inspect.Parameter.POSITIONAL_ONLY
        for p in parameters)  # fmt: skip
    return positional, session
