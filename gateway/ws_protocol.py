"""The uvicorn WebSocket protocol the server runs with (``uvicorn.run(..., ws=WebSocketProtocol)``).

uvicorn's ``websockets-sansio`` implementation (0.54) sends an app's denial response (ASGI
``websocket.http.response``, Starlette's ``send_denial_response``) correctly, but never marks the
handshake as finished, so when the app returns it logs ``ERROR: ASGI callable returned without
completing handshake.`` for every refused device (upstream: Kludex/uvicorn PR #3138, open). Its
``wsproto`` implementation already does this. :class:`WebSocketProtocol` marks the handshake done
once the denial's last body chunk went out; with a uvicorn that does it itself the override is a
no-op.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """``websockets-sansio`` without the spurious ERROR after a denial response."""

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message.get("type") == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True
