"""The OTA endpoint: the only way a device learns the WebSocket URL and framing.

Parsed leniently: devices send odd types (`minimum_free_heap_size` is a
string) and test clients send less. The reply never carries `mqtt` (the device
would switch transport), `activation`, or a firmware offer it would install.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from gateway.config import Config

log = logging.getLogger(__name__)

router = APIRouter()

DEVICE_WS_PATH = "/xiaozhi/v1/"


def websocket_url(config: Config, request: Request) -> str:
    if config.server.public_ws_url:
        return config.server.public_ws_url
    host = request.headers.get("x-forwarded-host") or request.headers.get("host")
    if not host:
        host = f"{request.url.hostname}:{request.url.port or config.server.port}"
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    scheme = "wss" if proto in ("https", "wss") else "ws"
    return f"{scheme}://{host}{DEVICE_WS_PATH}"


def ota_reply(config: Config, request: Request, body: dict[str, Any]) -> dict[str, Any]:
    token = config.server.auth.tokens[0] if config.server.auth.enabled and config.server.auth.tokens else ""
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
    raw = await request.body()
    body: dict[str, Any] = {}
    if raw:
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                body = parsed
        except (ValueError, UnicodeDecodeError):
            log.info("OTA request with a body that is not JSON (%d bytes)", len(raw))
    device_id = request.headers.get("device-id", "?")
    log.info("OTA from device %s (%s)", device_id, request.headers.get("user-agent", "?"))
    return JSONResponse(ota_reply(services.config, request, body))


@router.get("/xiaozhi/ota/")
@router.get("/xiaozhi/ota")
async def ota_status(request: Request) -> PlainTextResponse:
    url = websocket_url(request.app.state.services.config, request)
    return PlainTextResponse(f"OTA interface is running; websocket address: {url}")


@router.post("/xiaozhi/ota/activate")
async def activate() -> JSONResponse:
    # We never ask devices to activate; answer "done" if one asks anyway.
    return JSONResponse({"success": True})
