"""The web console: one page at ``/console`` to talk to the gateway as a device, try voices and watch it.

Plain HTML/CSS/JS in ``gateway/console_static/`` (no build step), served by the gateway itself. The
page and its assets are public (gateway/security/http_guard.py); what they call (``/v1/voices``,
``/v1/audio/speech``, ``/v1/status``) carries the API key the user types, and the device socket the
token OTA hands out (or an operator token typed by the user).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_PATH = "/console"
ASSETS_PATH = "/console/assets"
STATIC_DIR = Path(__file__).parent / "console_static"


def include_console(app: FastAPI) -> None:
    """Add ``/console`` (the page) and ``/console/assets/...`` (its scripts and styles) to ``app``."""

    @app.get(CONSOLE_PATH, include_in_schema=False)
    async def console_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get(CONSOLE_PATH + "/", include_in_schema=False)
    async def console_slash() -> RedirectResponse:
        return RedirectResponse(CONSOLE_PATH)

    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC_DIR), name="console-assets")
