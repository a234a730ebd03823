"""`BodySizeLimit`: refuse an oversized request body before anything parses or tokenizes it.

Without it a 10 MB body was JSON-parsed, validated and tokenized on the event loop (seconds,
``/health`` stalled, memory kept). A plain ASGI middleware, so nothing downstream sees the body
first: a declared ``Content-Length`` past the limit is refused before a byte is kept; a chunked
body is kept up to the limit and refused the moment it passes it.

The rest of a refused body is read and dropped before the 413 goes out (up to `DRAIN_BYTES`):
a client still writing its body to a socket closed under it sees a reset connection instead
of the answer. Dropping chunks as they arrive holds no memory and yields to the event loop
between chunks, so ``/health`` answers meanwhile.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrl_sdk.gateway.errors import GatewayError
from agentrl_sdk.gateway.stats import GatewayStats

DRAIN_BYTES = 64 * 1024 * 1024
"""Most bytes of a refused body read and dropped; past it the connection is simply closed."""


class BodySizeLimit:
    """ASGI middleware answering 413 ``request_too_large`` to bodies over ``max_bytes``
    (counted in ``stats.requests_too_large``)."""

    def __init__(self, app: ASGIApp, max_bytes: int, stats: GatewayStats) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (declared := _content_length(scope)) is not None:
            if declared > self.max_bytes:
                await _drop_body(receive, DRAIN_BYTES)
                await self._refuse(scope, receive, send, f"{declared} bytes")
                return
            # h11 frames the body by Content-Length: it cannot grow past what was declared.
            await self.app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                if more:
                    await _drop_body(receive, DRAIN_BYTES)
                await self._refuse(scope, receive, send, f"over {self.max_bytes} bytes (chunked)")
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        self.stats.requests_too_large += 1
        error = GatewayError(
            413, f"request body of {size} is larger than this gateway accepts "
            f"({self.max_bytes} bytes, max_request_bytes): shorten the conversation or raise "
            "the limit", code="request_too_large",
        )
        # A body drained only in part leaves the connection unusable: uvicorn closes it.
        response = JSONResponse(error.body.model_dump(), status_code=413,
                                headers={"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses a malformed length before we are called
    return None


async def _drop_body(receive: Receive, budget: int) -> None:
    """Read and drop the rest of the request body, at most ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read body once, then defers to the real one
    (which reports the client's disconnect to streaming responses)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Any:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
