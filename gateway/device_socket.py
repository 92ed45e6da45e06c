"""The device WebSocket endpoint: handshake, auth, one Session per connection."""

from __future__ import annotations

import contextlib
import logging

from fastapi import APIRouter, WebSocket
from fastapi.responses import PlainTextResponse
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.ota import DEVICE_WS_PATH
from gateway.services import Services
from gateway.session import Session
from gateway.xiaozhi import HandshakeInfo, RemoteProtocolError, parse_handshake

log = logging.getLogger(__name__)

router = APIRouter()


class StarletteDeviceSocket:
    """Adapts Starlette's WebSocket to the Session's small socket protocol."""

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


def authorized(services: Services, info: HandshakeInfo) -> bool:
    auth = services.config.server.auth
    if not auth.enabled:
        return True
    if info.device_id and info.device_id in auth.allowed_devices:
        return True
    return bool(info.token) and info.token in auth.tokens


async def _reject(ws: WebSocket, status: int, message: str) -> None:
    try:
        await ws.send_denial_response(PlainTextResponse(message, status_code=status))
    except RuntimeError:  # server without the denial-response extension
        await ws.close(code=1008)


async def device_endpoint(ws: WebSocket) -> None:
    services: Services = ws.app.state.services
    try:
        info = parse_handshake(ws.headers, ws.query_params)
    except RemoteProtocolError as exc:
        await _reject(ws, 400, f"bad handshake: {exc}")
        return
    if not authorized(services, info):
        log.info("device %s refused: bad or missing token", info.device_id)
        await _reject(ws, 401, "authentication failed")
        return
    await ws.accept()
    key = services.session_key(info.device_id)
    old = services.sessions.get(key)
    if old is not None:
        log.info("device %s reconnected; closing its previous session", key)
        await old.close()
    session = Session(StarletteDeviceSocket(ws), info, services)
    services.sessions[key] = session
    log.info("device %s connected (framing v%d)", key, info.protocol_version)
    try:
        await session.run()
    finally:
        if services.sessions.get(key) is session:
            del services.sessions[key]
        await StarletteDeviceSocket(ws).close()
        log.info("device %s disconnected", key)


router.add_api_websocket_route(DEVICE_WS_PATH, device_endpoint)
router.add_api_websocket_route("/xiaozhi/v1", device_endpoint)


@router.get(DEVICE_WS_PATH)
async def device_path_status() -> PlainTextResponse:
    return PlainTextResponse("Server is running")
