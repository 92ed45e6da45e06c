"""Optional API keys for the HTTP/WS API (``api.api_keys`` in config, env ``XZ_API__API_KEYS=k1,k2``).

With no keys configured every request passes. Otherwise a request must carry one of the keys as
``Authorization: Bearer <key>`` or, for clients that cannot set headers (the incumbent's
``index_stream`` provider posts to a bare URL), as the ``api_key`` query parameter.
"""

from __future__ import annotations

import hmac

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


def is_authorized(conn: HTTPConnection) -> bool:
    keys: list[str] = conn.app.state.services.config.api.api_keys
    if not keys:
        return True
    key = presented_key(conn)
    if key is None:
        return False
    # Compare with every key (no early exit) so timing does not tell which key is closest.
    matches = [hmac.compare_digest(key.encode(), k.encode()) for k in keys]
    return any(matches)


async def require_api_key(request: Request) -> None:
    """Route dependency: 401 unless the request carries a configured key (or none are configured)."""
    if is_authorized(request):
        return
    if presented_key(request) is None:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key",
                       headers=_CHALLENGE)  # fmt: skip
    raise ApiError(401, "invalid API key", code="invalid_api_key", headers=_CHALLENGE)


def websocket_authorized(websocket: WebSocket) -> bool:
    return is_authorized(websocket)
