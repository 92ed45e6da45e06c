"""The WebSocket transport: Starlette's WebSocket as a `DeviceTransport` (gateway/transport/base.py).

Text frames are JSON messages; binary frames are Opus packets in the connection's binary framing
(v1/v2/v3), which the session's codec strips and adds. The endpoint that admits devices and runs
their sessions is gateway/device/socket.py.
"""

from __future__ import annotations

import contextlib

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState


class StarletteDeviceSocket:
    """Adapts Starlette's WebSocket to the Session's small transport protocol."""

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws

    async def receive(self) -> str | bytes | None:
        try:
            message = await self._ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return None
        if message["type"] == "websocket.disconnect":
            return None
        if message.get("bytes") is not None:
            return message["bytes"]
        return message.get("text") or ""

    async def send_text(self, text: str) -> None:
        await self._ws.send_text(text)

    async def send_bytes(self, data: bytes) -> None:
        await self._ws.send_bytes(data)

    async def close(self, code: int = 1000) -> None:
        if self._ws.application_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await self._ws.close(code)
