"""The device WebSocket endpoint: handshake, auth, one Session per connection.

A refused upgrade gets a plain HTTP answer: 400 (bad handshake), 401 (no valid token) or 409 (the
Device-Id is connected with a token and this connection has none). A new connection with the
same Device-Id replaces the old session only once it is admitted, and never with less proof.
The registry of live sessions (gateway/device/registry.py) is written only here and by the MQTT
listener (gateway/transport/mqtt.py), under the same rules.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fastapi import APIRouter, WebSocket
from fastapi.responses import PlainTextResponse

from gateway.device.ota import DEVICE_WS_PATH, public_origin
from gateway.device.session import Session
from gateway.security.device_tokens import Admission, DeviceAuth
from gateway.security.log_redaction import loggable
from gateway.services import Services
from gateway.store import StoreError
from gateway.transport.websocket import StarletteDeviceSocket
from gateway.xiaozhi import HandshakeInfo, RemoteProtocolError, parse_handshake

log = logging.getLogger(__name__)

router = APIRouter()


async def _reject(ws: WebSocket, status: int, message: str) -> None:
    """Refuses the upgrade with an HTTP response (a 403 from a server without the denial extension)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(PlainTextResponse(message, status_code=status))
    else:
        await ws.close(code=1008)


async def device_endpoint(ws: WebSocket) -> None:
    services: Services = ws.app.state.services
    device_auth: DeviceAuth = ws.app.state.device_auth
    try:
        info = parse_handshake(ws.headers, ws.query_params)
    except RemoteProtocolError as exc:
        log.info("device handshake refused: %s", exc)
        await _reject(ws, 400, f"bad handshake: {exc}")
        return
    admission = device_auth.check(info, activated=await _activated(services, device_auth, info))
    if admission is Admission.REFUSED:
        log.info("device %s refused: bad or missing token", loggable(info.device_id or "?"))
        await _reject(ws, 401, "authentication failed")
        return
    info = replace(info, authenticated=admission is Admission.AUTHENTICATED)
    registry = services.sessions
    key = registry.key_for(info.device_id)
    if not registry.may_replace(key, authenticated=info.authenticated):
        log.warning("device %s refused: already connected with a token, this connection has none", key)
        await _reject(ws, 409, "this device is connected with a token; reconnect with a valid token")
        return
    session = Session(StarletteDeviceSocket(ws), info, services, origin=public_origin(services.config, ws))
    old = registry.claim(key, session)  # before the first await: no race with another upgrade
    try:
        if old is not None:
            log.info("device %s reconnected; closing its previous session", key)
            await old.close()
        await ws.accept()
        log.info("device %s connected (framing v%d%s)", key, info.protocol_version,
                 ", token" if info.authenticated else "")  # fmt: skip
        await session.run()
    finally:
        registry.release(key, session)
        await StarletteDeviceSocket(ws).close()
        log.info("device %s disconnected", key)


async def _activated(services: Services, device_auth: DeviceAuth, info: HandshakeInfo) -> bool:
    """Whether a device with a token activated by code (``ota.activation: code``; only asked when it
    matters). A store that cannot say admits a device whose token is valid (signed for its Device-Id)."""
    if device_auth.signer is None or not info.token or not info.device_id or services.devices is None:
        return False
    if services.config.ota.activation != "code":
        return False
    try:
        state = await services.devices.state(info.device_id)
    except StoreError as exc:
        log.info("device %s: activation not checked (%s); its token decides", info.device_id, exc)
        return True
    return state is not None and state.activated


router.add_api_websocket_route(DEVICE_WS_PATH, device_endpoint)
router.add_api_websocket_route("/xiaozhi/v1", device_endpoint)


@router.get(DEVICE_WS_PATH)
async def device_path_status() -> PlainTextResponse:
    return PlainTextResponse("Server is running")
