"""The OTA endpoint: the only way a device learns the WebSocket URL and framing.

Parsed leniently: devices send odd types (`minimum_free_heap_size` is a
string) and test clients send less. The reply carries `mqtt` (the device then switches to MQTT + UDP)
only when `transport.mqtt` is on for that device (gateway/transport/ota_offer.py, docs/mqtt-udp.md)
and the device is not in the middle of activating, and never a firmware offer it would install.

Every OTA check is recorded in the device registry (gateway/devices/registry.py: board, firmware,
address, ...). With `ota.activation: code` (`ota_activation`) a device that has not activated gets the
`activation` object (code, message, challenge, timeout_ms) and polls `POST /xiaozhi/ota/activate`
(`activate`: 202 until an operator entered its code, then 200, gateway/devices/activation.py); an
activated device gets its device token. `ota.activation: off` (the default) never sends `activation`
and answers `/activate` with success.

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
from starlette.requests import HTTPConnection

from gateway.config import Config
from gateway.devices.registry import DeviceReport, TooManyDevices
from gateway.security.device_tokens import DeviceAuth
from gateway.security.log_redaction import loggable
from gateway.store import StoreError
from gateway.transport.ota_offer import add_mqtt_offer
from gateway.xiaozhi import RemoteProtocolError
from gateway.xiaozhi.handshake import check_identity, normalize_device_id

log = logging.getLogger(__name__)

router = APIRouter()

DEVICE_WS_PATH = "/xiaozhi/v1/"


_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")


def _forwarded(request: HTTPConnection, name: str) -> str | None:
    """The first (client-side) value of an X-Forwarded-* header, or None."""
    value = request.headers.get(name, "").split(",")[0].strip()
    return value or None


def websocket_url(config: Config, request: HTTPConnection) -> str:
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


def public_origin(config: Config, conn: HTTPConnection) -> str:
    """``http(s)://host[:port]`` as devices reach this gateway (the WebSocket URL's scheme and host)."""
    scheme, _, rest = websocket_url(config, conn).partition("://")
    return ("https" if scheme == "wss" else "http") + "://" + rest.split("/", 1)[0]


def client_address(config: Config, request: HTTPConnection) -> str | None:
    """The client's address (behind a trusted proxy: the first X-Forwarded-For entry)."""
    if config.server.trust_forwarded_headers:
        forwarded = _forwarded(request, "x-forwarded-for")
        if forwarded:
            return forwarded[:64]
    return request.client.host if request.client is not None else None


def ota_reply(
    config: Config, request: Request, body: dict[str, Any], token: str | None = ""
) -> dict[str, Any]:
    """``token``: the device token for this device ("" when auth is off or the device is not admitted;
    None: leave it out, so the device keeps the one it has)."""
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
    if token is None:
        del reply["websocket"]["token"]
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
    config: Config = services.config
    report = None
    if device_id:
        report = DeviceReport.from_ota(
            device_id, client_id, request.headers, body, client_address(config, request)
        )
    activated: bool | None = False
    activation: dict[str, Any] | None = None
    if config.ota.activation == "code" and report is not None:
        outcome = await ota_activation(services, report)
        if isinstance(outcome, JSONResponse):
            return outcome
        activated, activation = outcome
    elif report is not None and services.activation is not None:  # recorded in the background
        services.devices.spawn(_record(services.activation, report), f"OTA of {device_id}")
    token: str | None = device_auth.token_for(device_id, client_id, activated=activated is True)
    if activated is None:
        token = None  # the store cannot say: the device keeps the token it has
    user_agent = loggable(request.headers.get("user-agent", "?"))
    if device_auth.signer is not None and not token:
        log.info("OTA from device %s (%s): not admitted, no device token", device_id or "?", user_agent)
    else:
        log.info("OTA from device %s (%s)", device_id or "?", user_agent)
    reply = ota_reply(config, request, body, token)
    if activation is not None:
        reply["activation"] = activation
    else:  # `mqtt` only with transport.mqtt on for this device, and not before it has activated
        add_mqtt_offer(reply, request, device_id, client_id)
    return JSONResponse(reply)


async def _record(activation: Any, report: DeviceReport) -> None:
    await activation.record(report)


async def ota_activation(
    services: Any, report: DeviceReport
) -> tuple[bool | None, dict[str, Any] | None] | JSONResponse:
    """``ota.activation: code``: (activated, the activation object to send), or the answer itself (429,
    503). activated None: the store cannot say now (no token, no activation object: the device keeps
    what it has and checks again at its next boot)."""
    try:
        outcome = await services.activation.at_ota(report)
    except TooManyDevices as exc:
        log.warning("OTA from device %s: %s", report.device_id, exc)
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "60"})
    except StoreError as exc:
        log.warning(
            "OTA from device %s: activation state unknown, the store failed: %s", report.device_id, exc
        )
        return None, None
    if outcome.retry_after_s is not None:
        return JSONResponse(
            {"error": "too many new devices from this address; try again later"},
            status_code=429,
            headers={"Retry-After": str(int(outcome.retry_after_s) + 1)},
        )
    return outcome.activated, outcome.activation


@router.get("/xiaozhi/ota/")
@router.get("/xiaozhi/ota")
async def ota_status(request: Request) -> PlainTextResponse:
    url = websocket_url(request.app.state.services.config, request)
    return PlainTextResponse(f"OTA interface is running; websocket address: {url}")


@router.post("/xiaozhi/ota/activate")
@router.post("/xiaozhi/ota/activate/")
async def activate(request: Request) -> JSONResponse:
    """The device polls here after OTA gave it a code: 202 while the code waits, 200 once entered."""
    services = request.app.state.services
    config: Config = services.config
    if config.ota.activation != "code" or services.activation is None:
        return JSONResponse({"success": True})  # we never asked it to activate: done
    try:
        device_id = normalize_device_id(check_identity("Device-Id", request.headers.get("device-id") or None))
    except RemoteProtocolError as exc:
        return JSONResponse({"success": False, "message": str(exc)}, status_code=400)
    raw = await request.body()
    body: dict[str, Any] = {}
    if raw:
        try:
            parsed = json.loads(raw)
            body = parsed if isinstance(parsed, dict) else {}
        except (ValueError, UnicodeDecodeError):
            return JSONResponse({"success": False, "message": "the body is not JSON"}, status_code=400)
    try:
        answer = await services.activation.activate(
            device_id, request.headers, body, client_address(config, request)
        )
    except StoreError as exc:
        log.warning("activation of %s: the store failed: %s", device_id, exc)
        return JSONResponse({"success": False, "message": "the store is unavailable; retry"}, status_code=503)
    return JSONResponse(answer.body, status_code=answer.status)
