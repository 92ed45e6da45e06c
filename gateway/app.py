"""Assembles the FastAPI app: device socket, OTA, the TTS API (gateway/api), health, metrics, and the
HTTP guard in front of them (API keys and body caps, gateway/security/http_guard.py); with
`transport.mqtt` on, the MQTT listener and UDP audio endpoint start and stop in its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.api import include_api
from gateway.config import Config
from gateway.console import include_console
from gateway.device import ota
from gateway.device import socket as device_socket
from gateway.security.device_tokens import DeviceAuth
from gateway.security.http_guard import HttpGuard
from gateway.security.log_redaction import install_log_redaction
from gateway.services import Services

log = logging.getLogger(__name__)


def create_app(config: Config, *, services: Services | None = None) -> FastAPI:
    """`services` lets tests inject an engine/LLM; otherwise built from config at start-up."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or Services.build(config)
        app.state.services = svc
        await svc.start()
        mqtt = None
        if config.transport.mqtt.enabled:  # MQTT + UDP devices (docs/mqtt-udp.md); the codec loads only then
            from gateway.transport.mqtt import MqttGateway

            mqtt = MqttGateway(config, svc, app.state.device_auth)
            await mqtt.start()
            app.state.mqtt = mqtt
        log.info(
            "gateway ready: tts=%s llm=%s asr=%s downlink=%d Hz",
            svc.engine.backend_name,
            config.llm.provider,
            svc.asr.name,
            svc.turns.sample_rate,
        )
        try:
            yield
        finally:
            if mqtt is not None:
                mqtt.stop_accepting()  # no new MQTT sessions while the live ones end with a goodbye
            await svc.close()
            if mqtt is not None:
                await mqtt.close()
                app.state.mqtt = None

    app = FastAPI(title="Xiaozhi gateway", version="0.1.0", lifespan=lifespan)
    # API keys before any body is read, and every body capped while it streams (401 / 413).
    docs_paths = (app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url)
    app.add_middleware(
        HttpGuard, api=config.api, docs_paths=docs_paths, vision_max_bytes=config.vision.max_image_bytes
    )
    install_log_redaction()  # no credentials from query strings in uvicorn's logs
    app.state.device_auth = DeviceAuth.from_config(config.server.auth)  # OTA tokens, socket admission
    app.state.mqtt = None  # the MQTT listener and UDP endpoint while transport.mqtt is on (lifespan)
    app.include_router(ota.router)
    app.include_router(device_socket.router)

    include_api(app)  # /v1/health, /v1/status, /v1/tts..., /v1/audio/speech, /tts, /v1/voices, /ws/tts
    include_console(app)  # /console: the web console (public static page; its API calls carry the key)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        registry = request.app.state.services.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # Devices may be configured with another path; the incumbent ignores it too.
    app.add_api_websocket_route("/{path:path}", device_socket.device_endpoint)
    return app
