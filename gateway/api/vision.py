"""``POST /mcp/vision/explain``: the firmware's camera tool asks what a photo shows.

The device posts multipart ``question`` and ``file`` (a JPEG) with ``Authorization: Bearer <token>``,
``Device-Id`` and ``Client-Id``; the token is the vision token MCP ``initialize`` gave this Device-Id
(gateway/agents/vision.py) and is checked before any of the body is read (401). The body is capped
while it streams (``vision.max_image_bytes``, gateway/security/http_guard.py: 413), the image's type is
read from its magic bytes (JPEG, PNG, WebP; anything else 415), the question is capped
(``vision.max_question_chars``). The answer is what the incumbent server returns and the firmware hands
to its LLM as the tool's result: ``{"success": true, "action": "RESPONSE", "response": "..."}``;
failures ``{"success": false, "message": "..."}`` with a 4xx (bad input), 404 (vision is off: no vision
model for this device's agent) or 502 (the model failed).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from gateway.agents.vision import VISION_PATH, VisionError, image_type
from gateway.api.auth import presented_key
from gateway.api.errors import ApiError
from gateway.api.forms import StrictFormRequest
from gateway.services import Services
from gateway.xiaozhi import RemoteProtocolError
from gateway.xiaozhi.handshake import check_identity, normalize_device_id

router = APIRouter(tags=["devices"])
log = logging.getLogger(__name__)


def _failed(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


@router.post(VISION_PATH)
async def explain(request: Request) -> JSONResponse:
    services: Services = request.app.state.services
    vision, agents = services.vision, services.agents
    if vision is None or agents is None:
        return _failed(404, "vision is not configured")
    try:
        device_id = normalize_device_id(check_identity("Device-Id", request.headers.get("device-id") or None))
    except RemoteProtocolError as exc:
        return _failed(400, str(exc))
    if not vision.verify(presented_key(request), device_id):
        return _failed(401, "a valid vision token for this Device-Id is needed (from MCP initialize)")
    cfg = services.config.vision
    form_request = StrictFormRequest(request.scope, request.receive)
    try:
        form = await form_request.form(
            max_files=1, max_fields=4, max_part_size=cfg.max_question_chars * 4 + 1024
        )
    except (HTTPException, ApiError) as exc:
        message = exc.message if isinstance(exc, ApiError) else str(exc.detail)
        return _failed(
            413 if "413" in message else 400, f"not a multipart form with question and file: {message}"
        )
    try:
        return await _answer(services, device_id or "", form.get("question"), form.get("file"))
    finally:
        await form.close()


async def _answer(services: Services, device_id: str, question: Any, upload: Any) -> JSONResponse:
    assert services.vision is not None and services.agents is not None
    cfg = services.config.vision
    if not isinstance(upload, UploadFile):
        return _failed(400, "no image: send it as the multipart field 'file'")
    question = question if isinstance(question, str) else ""
    if len(question) > cfg.max_question_chars:
        return _failed(400, f"the question is longer than {cfg.max_question_chars} characters")
    image = await upload.read(cfg.max_image_bytes + 1)
    if len(image) > cfg.max_image_bytes:
        return _failed(413, f"the image is larger than {cfg.max_image_bytes} bytes")
    mime = image_type(image)
    if mime is None:
        return _failed(415, "the image is not a JPEG, PNG or WebP file")
    agent = await services.agents.for_device(device_id)
    if agent.activation is not None:
        return _failed(403, "this device has not activated")
    if not services.vision.enabled_for(agent.profile):
        return _failed(404, "vision is not configured for this device's agent")
    try:
        answer = await services.vision.explain(agent.profile, image, mime, question)
    except VisionError as exc:
        log.warning("vision for %s failed: %s", device_id, exc)
        return _failed(502, f"the vision model failed: {exc}")
    log.info("vision for %s: %d bytes of %s explained", device_id, len(image), mime)
    return JSONResponse({"success": True, "action": "RESPONSE", "response": answer})
