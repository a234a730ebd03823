"""`GatewayError`: a failure the gateway answers with an OpenAI-style error body."""

from __future__ import annotations

from agentrl_sdk.errors import AgentRLError
from agentrl_sdk.gateway.protocol import ErrorBody, ErrorResponse


class GatewayError(AgentRLError):
    """An HTTP error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``).

    Args:
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``...).
        code: A machine-readable code (``model_not_found``, ``context_length_exceeded``...).
        param: The request field at fault, if any.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorResponse(
            error=ErrorBody(message=message, type=type, code=code, param=param)
        )
