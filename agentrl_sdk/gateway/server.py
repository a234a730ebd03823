"""`Gateway`: the recording gateway served by uvicorn inside the caller's event loop."""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentrl_sdk.chat.recorder import RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import RolloutConfig
from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.gateway.config import GatewayConfig
from agentrl_sdk.gateway.sessions import RolloutSession, SessionRegistry
from agentrl_sdk.gateway.stats import GatewayStats
from agentrl_sdk.types import Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.engines.base import Engine
    from agentrl_sdk.gateway._uvicorn import InLoopServer

logger = logging.getLogger(__name__)


class Gateway:
    """An OpenAI-compatible server whose every call is recorded into a rollout's token ledger.

    The server runs as a task on the event loop that calls `start` (the engines may be awaited
    from any loop), so rollouts opened and closed here need no locking.

    Args:
        engine: The engine, or one engine per policy (``config.models`` maps names to policies).
        tokenizer: The policy model's tokenizer (its chat template renders prompts).
        on_client_close: Called with the trajectory of each rollout a client closes
            (``DELETE /rollouts/<id>``); when set, the rollouts the gateway opens by id also
            time their calls into ``Trajectory.events`` (what a trace is built from).
            `agentrl gateway --tracking-uri` traces them this way. It must not block.
    """

    def __init__(
        self,
        engine: Engine | Mapping[str, Engine],
        tokenizer: Any,
        *,
        config: GatewayConfig | None = None,
        rollout: RolloutConfig | None = None,
        on_client_close: Callable[[Trajectory], Any] | None = None,
    ) -> None:
        self.engine = engine
        self.on_client_close = on_client_close
        self.config = config or GatewayConfig()
        self.rollout = rollout or RolloutConfig()
        self.template = tokenizer if isinstance(tokenizer, ChatTemplate) else ChatTemplate(
            tokenizer, tool_prompt=self.rollout.chat.tool_prompt
        )
        self.api_key = ((self.config.api_key or secrets.token_urlsafe(24))
                        if self.config.auth else None)
        self.stats = GatewayStats()
        self.registry = SessionRegistry(
            self._recorder, open_on_first_call=self.config.open_on_first_call,
            max_client=self.config.max_client_rollouts,
            client_ttl_s=self.config.client_rollout_ttl_s, stats=self.stats,
        )
        self._server: InLoopServer | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The server's root URL (``http://127.0.0.1:PORT``)."""
        if self.port is None:
            raise AgentRLError("the gateway is not started: await gateway.start() first")
        return f"http://{self.config.host}:{self.port}"

    def rollout_url(self, rollout_id: str) -> str:
        """The OpenAI base URL of one rollout (``.../rollouts/<id>/v1``)."""
        return f"{self.url}/rollouts/{rollout_id}/v1"

    def open(
        self,
        rollout_id: str | None = None,
        *,
        row_id: str = "",
        sample_index: int = 0,
        record_events: bool = False,
    ) -> RolloutSession:
        """Open a rollout; its calls are recorded until `close`.

        ``record_events`` times every engine call into ``Trajectory.events`` (for its trace).
        """
        recorder = None
        if record_events:
            recorder = self._recorder(rollout_id or uuid.uuid4().hex, record_events=True)
            rollout_id = recorder.rollout_id
        return self.registry.open(rollout_id, recorder, row_id=row_id, sample_index=sample_index)

    def close(self, rollout_id: str) -> Trajectory:
        """Close a rollout and return its trajectory; later calls with its id get a 404."""
        return self.registry.close(rollout_id).trajectory()

    async def start(self) -> Gateway:
        """Listen (returns once the socket accepts connections)."""
        try:
            from agentrl_sdk.gateway._uvicorn import InLoopServer
            from agentrl_sdk.gateway.app import create_app
            from agentrl_sdk.gateway.disconnects import CancelOnDisconnect
        except ImportError as exc:
            raise AgentRLError(
                f"the recording gateway needs FastAPI and uvicorn ({exc.name} is missing): "
                "pip install 'agentrl-sdk[gateway]'"
            ) from exc

        app = CancelOnDisconnect(create_app(self.registry, self.config, self.api_key,
                                            self.on_client_close), self.stats)
        self._server = InLoopServer(app, self.config.host, self.config.port, "the gateway")
        self.port = await self._server.listen("agentrl-gateway", self.config.start_timeout_s)
        if self.config.open_to_anyone:
            logger.warning(
                "\n%s\nTHE RECORDING GATEWAY ON %s:%d HAS NO AUTH: anyone who can reach this "
                "port can generate with the model and read, reward and close rollouts "
                "(allow_unauthenticated_remote is set). Turn auth on unless this network is "
                "yours alone.\n%s", "!" * 72, self.config.host, self.port, "!" * 72,
            )
        return self

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop listening; connections still open are closed after ``timeout_s``."""
        if self._server is not None:
            await self._server.stop(timeout_s)
        self._server = None

    async def __aenter__(self) -> Gateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _recorder(self, rollout_id: str, record_events: bool = False) -> RolloutRecorder:
        return RolloutRecorder.for_rollout(
            self.engine, self.template, self.rollout, rollout_id,
            record_events=record_events or self.on_client_close is not None)
