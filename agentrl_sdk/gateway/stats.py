"""`GatewayStats`: what the gateway refused or dropped, counted (served on ``/health``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewayStats:
    """Counters since the gateway started; the gateway's one event loop updates them.

    Client rollouts are those opened over HTTP (``POST /rollouts``, or a first call to an
    unknown id under ``open_on_first_call``); rollouts the pipeline opens in-process are not.
    """

    client_rollouts_opened: int = 0
    client_rollouts_expired: int = 0
    client_rollouts_refused: int = 0
    requests_too_large: int = 0
    client_disconnects: int = 0  # chat completions cancelled: the client hung up first
