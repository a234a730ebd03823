"""The served graph's HTTP routes: ``POST /invoke`` runs it once, ``GET /health`` counts.

``POST /invoke`` takes ``{"input": <graph input>, "tags": {"name": "value", ...}}`` (tags
optional, strings only, set on the request's trace) and answers ``{"request_id", "status",
"output", "trace_id"}``: 200 when the run ended ``ok``, 504 on its timeout, 500 when it failed
otherwise (the error is in its trace, not in the answer). What the model wrote is returned as
data, never interpreted.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from agentrl_sdk.gateway.limits import BodySizeLimit
from agentrl_sdk.gateway.stats import GatewayStats

Invoke = Callable[[Any, Mapping[str, str] | None], Awaitable[Any]]
"""Runs the target once on an input, with trace tags; answers a `Served`."""

__all__ = ["MAX_TAGS", "create_app"]

MAX_TAGS = 32
"""Most tags one request may set on its trace (each name and value at most 250 characters)."""
_TAG_CHARS = 250

_STATUS_CODES = {"ok": 200, "timeout": 504}


def create_app(
    run: Invoke,
    health_counts: Callable[[], dict[str, Any]],
    *,
    api_key: str | None,
    max_request_bytes: int,
) -> ASGIApp:
    """The routes over a server's ``run`` and ``health_counts`` (``api_key``, when set, guards
    ``/invoke``; bodies over ``max_request_bytes`` are refused)."""

    async def invoke(request: Request) -> JSONResponse:
        if api_key is not None and not _authorized(request, api_key):
            return _error(401, "unauthorized", "send Authorization: Bearer <api_key>")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "invalid_json", "the body is not JSON")
        if (problem := _problem(body)) is not None:
            return _error(422, "invalid_request", problem)
        served = await run(body["input"], body.get("tags"))
        return JSONResponse(
            {"request_id": served.request_id, "status": served.status,
             "output": served.output, "trace_id": served.trace_id},
            status_code=_STATUS_CODES.get(served.status, 500),
        )

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse(health_counts())

    app = Starlette(routes=[Route("/invoke", invoke, methods=["POST"]),
                            Route("/health", health, methods=["GET"])])
    return BodySizeLimit(app, max_request_bytes, GatewayStats())


def _problem(body: Any) -> str | None:
    """What is wrong with a request body, or None."""
    if not isinstance(body, dict) or "input" not in body:
        return 'the body must be a JSON object with an "input" (the graph input)'
    tags = body.get("tags")
    if tags is None:
        return None
    if not isinstance(tags, dict) or len(tags) > MAX_TAGS:
        return f'"tags" must be an object of at most {MAX_TAGS} string values'
    for name, value in tags.items():
        if not isinstance(value, str) or len(name) > _TAG_CHARS or len(value) > _TAG_CHARS:
            return f'"tags" values must be strings; names and values at most {_TAG_CHARS} chars'
        if name.startswith("mlflow.") or name in _RESERVED:
            return f'tag {name[:_TAG_CHARS]!r} is set by the server'
    return None


_RESERVED = frozenset({"request_id", "model", "phase", "kind", "row_id", "sample_index",
                       "status", "policy_versions"})


def _authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())


def _error(code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=code)
