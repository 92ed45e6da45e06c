"""The OTA endpoint: the only way a device learns the WebSocket URL and framing.

Parsed leniently: devices send odd types (`minimum_free_heap_size` is a
string) and test clients send less. The reply carries `mqtt` (the device then switches to MQTT + UDP)
only when `transport.mqtt` is on for that device (gateway/transport/ota_offer.py, docs/mqtt-udp.md),
and never `activation` or a firmware offer it would install.

With `server.auth` on, `websocket.token` is a device token bound to the asking Device-Id, and only
for an admitted device (gateway/security/device_tokens.py, docs/device-auth.md); the operators' static
tokens are never sent. A Device-Id or Client-Id that is too long or unprintable gets a 400.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from gateway.config import Config
from gateway.security.device_tokens import DeviceAuth
from gateway.security.log_redaction import loggable
from gateway.transport.ota_offer import add_mqtt_offer
from gateway.xiaozhi import RemoteProtocolError
from gateway.xiaozhi.handshake import check_identity, normalize_device_id

log = logging.getLogger(__name__)

router = APIRouter()

DEVICE_WS_PATH = "/xiaozhi/v1/"


_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")


def _forwarded(request: Request, name: str) -> str | None:
    """The first (client-side) value of an X-Forwarded-* header, or None."""
    value = request.headers.get(name, "").split(",")[0].strip()
    return value or None


def websocket_url(config: Config, request: Request) -> str:
    """Where devices open the WebSocket: `server.public_ws_url`, else derived from this request.

    Behind a reverse proxy (deploy/nginx.conf) the gateway's own Host and scheme are not what devices
    can reach; with `server.trust_forwarded_headers` the proxy's X-Forwarded-Host/-Proto say it. Off by
    default: anyone who can reach the gateway directly could otherwise set them.
    """
    if config.server.public_ws_url:
        return config.server.public_ws_url
    trusted = config.server.trust_forwarded_headers
    host = (_forwarded(request, "x-forwarded-host") if trusted else None) or request.headers.get("host")
    if not host or not _HOST.match(host):
        host = f"{request.url.hostname}:{request.url.port or config.server.port}"
    proto = (_forwarded(request, "x-forwarded-proto") if trusted else None) or request.url.scheme
    scheme = "wss" if proto.lower() in ("https", "wss") else "ws"
    return f"{scheme}://{host}{DEVICE_WS_PATH}"


def ota_reply(config: Config, request: Request, body: dict[str, Any], token: str = "") -> dict[str, Any]:
    """``token``: the device token for this device ("" when auth is off or the device is not admitted)."""
    reply: dict[str, Any] = {
        "server_time": {
            "timestamp": int(time.time() * 1000),
            "timezone_offset": config.ota.timezone_offset_minutes,
        },
        "websocket": {
            "url": websocket_url(config, request),
            "token": token,
            "version": config.ota.websocket_version,
        },
    }
    application = body.get("application")
    version = application.get("version") if isinstance(application, dict) else None
    if isinstance(version, str) and version:
        # Echo the device's own version with no URL: never an upgrade offer.
        reply["firmware"] = {"version": version, "url": ""}
    return reply


@router.post("/xiaozhi/ota/")
@router.post("/xiaozhi/ota")
async def ota(request: Request) -> JSONResponse:
    services = request.app.state.services
    services.metrics.ota_requests.inc()
    try:  # checked before the body is read
        device_id = normalize_device_id(check_identity("Device-Id", request.headers.get("device-id") or None))
        client_id = check_identity("Client-Id", request.headers.get("client-id") or None)
    except RemoteProtocolError as exc:
        log.info("OTA refused: %s", exc)
        return JSONResponse({"error": str(exc)}, status_code=400)
    raw = await request.body()
    body: dict[str, Any] = {}
    if raw:
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                body = parsed
        except (ValueError, UnicodeDecodeError):
            log.info("OTA request with a body that is not JSON (%d bytes)", len(raw))
    device_auth: DeviceAuth = request.app.state.device_auth
    token = device_auth.token_for(device_id, client_id)
    user_agent = loggable(request.headers.get("user-agent", "?"))
    if device_auth.signer is not None and not token:
        log.info("OTA from device %s (%s): not admitted, no device token", device_id or "?", user_agent)
    else:
        log.info("OTA from device %s (%s)", device_id or "?", user_agent)
    reply = ota_reply(services.config, request, body, token)
    add_mqtt_offer(reply, request, device_id, client_id)  # `mqtt` only with transport.mqtt on for this device
    return JSONResponse(reply)


@router.get("/xiaozhi/ota/")
@router.get("/xiaozhi/ota")
async def ota_status(request: Request) -> PlainTextResponse:
    url = websocket_url(request.app.state.services.config, request)
    return PlainTextResponse(f"OTA interface is running; websocket address: {url}")


@router.post("/xiaozhi/ota/activate")
async def activate() -> JSONResponse:
    # We never ask devices to activate; answer "done" if one asks anyway.
    return JSONResponse({"success": True})
