"""The FastAPI app: OpenAI chat completions per rollout, rewards, trajectories, OpenAI errors."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from agentrl_sdk.gateway.completions import complete, stream_chunks
from agentrl_sdk.gateway.config import GatewayConfig
from agentrl_sdk.gateway.errors import GatewayError
from agentrl_sdk.gateway.limits import BodySizeLimit
from agentrl_sdk.gateway.protocol import ChatCompletionRequest, ModelCard, RewardRequest
from agentrl_sdk.gateway.sessions import (
    ExpiredRolloutError,
    SessionRegistry,
    TooManyRolloutsError,
    UnknownRolloutError,
)
from agentrl_sdk.types import RewardComponent, Trajectory, totals_by_name

ROLLOUT_HEADER = "X-Rollout-Id"
"""Header naming the rollout on the shared ``/v1`` routes (the path form needs none)."""


def create_app(
    registry: SessionRegistry,
    config: GatewayConfig,
    api_key: str | None,
    on_close: Callable[[Trajectory], Any] | None = None,
) -> FastAPI:
    """The gateway's routes over ``registry``.

    Only a chat completion may open a rollout (under ``open_on_first_call``); reading the
    trajectory of, or rewarding, an unknown id is a 404.

    Args:
        api_key: The bearer token every route but ``/health`` requires; None disables auth.
        on_close: Called with the trajectory of each rollout a client closes
            (``DELETE /rollouts/<id>``), e.g. to trace it; it must not block.
    """
    app = FastAPI(title="agentrl recording gateway", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes, stats=registry.stats)
    _install_error_handlers(app)
    authorized = [Depends(_bearer(api_key))] if api_key else []

    @app.get("/health")
    async def health() -> dict[str, Any]:
        registry.expire()
        return {"status": "ok", "rollouts": len(registry),
                "client_rollouts": registry.client_rollouts, **asdict(registry.stats)}

    @app.get("/v1/models", dependencies=authorized)
    @app.get("/rollouts/{rollout_id}/v1/models", dependencies=authorized)
    async def models() -> dict[str, Any]:
        return {"object": "list",
                "data": [ModelCard(id=name).model_dump() for name in config.models]}

    @app.post("/rollouts/{rollout_id}/v1/chat/completions", dependencies=authorized)
    async def chat(rollout_id: str, body: ChatCompletionRequest) -> Response:
        policy = config.models.get(body.model)
        if policy is None:
            raise GatewayError(
                404, f"the model {body.model!r} does not exist; this gateway serves "
                f"{sorted(config.models)}", code="model_not_found", param="model",
            )
        session = registry.get_or_open(rollout_id)
        completion = await complete(session, body, policy=policy, node=config.node)
        if body.stream:
            include = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream_chunks(completion, include_usage=include),
                                     media_type="text/event-stream")
        return JSONResponse(completion.model_dump(exclude_none=True))

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_by_header(
        body: ChatCompletionRequest,
        rollout_id: Annotated[str | None, Header(alias=ROLLOUT_HEADER)] = None,
    ) -> Response:
        if not rollout_id:
            raise GatewayError(
                400, f"name the rollout: POST to /rollouts/<id>/v1/chat/completions or send "
                f"the {ROLLOUT_HEADER} header", code="rollout_id_missing",
            )
        return await chat(rollout_id, body)

    @app.post("/rollouts", dependencies=authorized)
    async def open_rollout(request: Request) -> dict[str, str]:
        try:
            session = registry.open(by_client=True)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from exc
        base = str(request.base_url).rstrip("/")
        return {"rollout_id": session.rollout_id,
                "base_url": f"{base}/rollouts/{session.rollout_id}/v1"}

    @app.post("/rollouts/{rollout_id}/reward", dependencies=authorized)
    async def reward(rollout_id: str, body: RewardRequest) -> dict[str, Any]:
        recorder = registry.get(rollout_id).recorder
        try:
            component = RewardComponent(name=body.name, value=body.value, node=body.node,
                                        step=body.step)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from exc
        recorder.components.append(component)
        return {"rollout_id": rollout_id, "rewards": totals_by_name(recorder.components)}

    @app.get("/rollouts/{rollout_id}/trajectory", dependencies=authorized)
    async def trajectory(rollout_id: str) -> Response:
        return Response(registry.get(rollout_id).trajectory().model_dump_json(),
                        media_type="application/json")

    @app.delete("/rollouts/{rollout_id}", dependencies=authorized)
    async def close_rollout(rollout_id: str) -> Response:
        closed = registry.close(rollout_id).trajectory()
        if on_close is not None:
            on_close(closed)
        return Response(closed.model_dump_json(), media_type="application/json")

    return app


def _bearer(api_key: str):
    expected = f"Bearer {api_key}".encode()

    async def check(authorization: Annotated[str | None, Header()] = None) -> None:
        if authorization is None:
            raise GatewayError(401, "missing Authorization header: send 'Bearer <api key>'",
                               type="authentication_error", code="missing_api_key")
        if not hmac.compare_digest(authorization.encode(), expected):
            raise GatewayError(401, "incorrect API key", type="authentication_error",
                               code="invalid_api_key")

    return check


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure leaves as ``{"error": {...}}``, the shape OpenAI clients parse."""

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body.model_dump(), status_code=exc.status)

    @app.exception_handler(UnknownRolloutError)
    async def unknown_rollout(_: Request, exc: UnknownRolloutError) -> JSONResponse:
        if isinstance(exc, ExpiredRolloutError):
            error = GatewayError(404, f"rollout {exc.args[0]!r} was dropped after going idle "
                                 "longer than client_rollout_ttl_s; open a new one",
                                 code="rollout_expired")
        else:
            error = GatewayError(404, f"no open rollout {exc.args[0]!r} (never opened or "
                                 "already closed)", code="rollout_not_found")
        return await gateway_error(_, error)

    @app.exception_handler(TooManyRolloutsError)
    async def too_many(_: Request, exc: TooManyRolloutsError) -> JSONResponse:
        return await gateway_error(_, GatewayError(429, str(exc), type="rate_limit_error",
                                                   code="too_many_rollouts"))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return await gateway_error(_, GatewayError(400, message, param=where or None))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return await gateway_error(_, GatewayError(exc.status_code, str(exc.detail)))
