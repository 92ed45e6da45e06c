"""Optional API keys for the HTTP/WS API (``api.api_keys`` in config, env ``XZ_API__API_KEYS=k1,k2``).

With no keys configured every request passes. Otherwise a request must carry one of the keys as
``Authorization: Bearer <key>`` or, for clients that cannot set headers (the incumbent's
``index_stream`` provider posts to a bare URL), as the ``api_key`` query parameter.

Plain HTTP requests are checked by ``gateway.security.http_guard`` before their body is read (that also covers
``/metrics`` and the OpenAPI docs); ``require_api_key`` stays on the API routers as a second line, and
``/ws/tts`` checks its handshake with ``websocket_authorized``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from fastapi import Request, WebSocket
from starlette.requests import HTTPConnection

from gateway.api.errors import ApiError

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def presented_key(conn: HTTPConnection) -> str | None:
    """The key a request carries, if any."""
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return conn.query_params.get("api_key") or None


def key_error(conn: HTTPConnection, keys: Sequence[str]) -> ApiError | None:
    """The 401 for a request that does not carry one of ``keys``; None when it does or none are set."""
    if not keys:
        return None
    key = presented_key(conn)
    if key is None:
        return ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key",
                        headers=_CHALLENGE)  # fmt: skip
    # Compare with every key (no early exit) so timing does not tell which key is closest.
    matches = [hmac.compare_digest(key.encode(), k.encode()) for k in keys]
    if any(matches):
        return None
    return ApiError(401, "invalid API key", code="invalid_api_key", headers=_CHALLENGE)


def is_authorized(conn: HTTPConnection) -> bool:
    return key_error(conn, conn.app.state.services.config.api.api_keys) is None


async def require_api_key(request: Request) -> None:
    """Route dependency: 401 unless the request carries a configured key (or none are configured)."""
    error = key_error(request, request.app.state.services.config.api.api_keys)
    if error is not None:
        raise error


def websocket_authorized(websocket: WebSocket) -> bool:
    return is_authorized(websocket)


async def require_admin(request: Request) -> None:
    """Route dependency of the management API (devices, agents, activation): an admin key. Every
    ``api.api_keys`` entry is an admin key for now (the same keys as the rest of the API); with no keys
    configured the management API is open, as the rest of the API is (the start-up log warns)."""
    error = key_error(request, request.app.state.services.config.api.api_keys)
    if error is not None:
        raise error
