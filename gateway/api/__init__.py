"""The HTTP/WebSocket TTS API: speech (files, streams, OpenAI, the incumbent's /tts), WS, voices, health.

Every endpoint uses the one shared engine (``app.state.services.engine``); see ``speech``, ``ws_tts``,
``voices``, ``health``, ``usage`` and ``batches`` for the routes, ``auth`` for the optional API keys and ``errors`` for the
JSON error shape.
"""

from fastapi import FastAPI

from gateway.api import (
    agents,
    batches,
    devices,
    health,
    memory,
    speech,
    status,
    usage,
    vision,
    voices,
    ws_tts,
)


def include_api(app: FastAPI) -> None:
    """Add every API route to ``app`` (before any catch-all WebSocket route)."""
    app.include_router(health.router)
    app.include_router(status.router)
    app.include_router(speech.router)
    app.include_router(voices.router)
    app.include_router(memory.router)
    app.include_router(ws_tts.router)
    app.include_router(devices.router)
    app.include_router(agents.router)
    app.include_router(vision.router)
    app.include_router(usage.router)
    app.include_router(batches.router)


__all__ = ["include_api"]
