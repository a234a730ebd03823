"""`CancelOnDisconnect`: a chat completion whose client hangs up before the answer is cancelled.

Uvicorn keeps running a handler whose client went away, so without this the engine's answer
to a dropped request was recorded in the rollout's ledger although no client ever saw it; the
client's retry then recorded the same prompt a second time (found by ``benchmarks/soak.py``).
Cancelling the handler cancels ``record_turn`` inside its engine call, which releases the
ledger's plan: nothing is recorded and the engine drops the request.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrl_sdk.gateway.stats import GatewayStats


class CancelOnDisconnect:
    """ASGI wrapper: cancels a chat-completion request when its client disconnects before the
    response starts (counted as ``client_disconnects``). Other requests pass straight through.

    The request's messages are read by a pump task and handed to the app in order, so the app
    reads its body as before while the wrapper sees the ``http.disconnect`` that follows it.
    """

    def __init__(self, app: ASGIApp, stats: GatewayStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        inbox: asyncio.Queue[Message] = asyncio.Queue()
        gone = asyncio.Event()
        responding = False

        async def pump() -> None:
            while True:
                message = await receive()
                inbox.put_nowait(message)
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        async def app_receive() -> Message:
            if gone.is_set() and inbox.empty():  # as uvicorn: disconnected stays disconnected
                return {"type": "http.disconnect"}
            return await inbox.get()

        async def app_send(message: Message) -> None:
            nonlocal responding
            responding = True  # from here the app answers (and a stream sees the disconnect)
            await send(message)

        pumping = asyncio.create_task(pump())
        app = asyncio.create_task(self.app(scope, app_receive, app_send))
        watch = asyncio.create_task(gone.wait())
        try:
            await asyncio.wait({app, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not app.done() and not responding:
                app.cancel()
                self.stats.client_disconnects += 1
                await asyncio.gather(app, return_exceptions=True)
                return
            await app
        finally:
            for task in (pumping, watch, app):
                task.cancel()
            await asyncio.gather(pumping, watch, return_exceptions=True)
