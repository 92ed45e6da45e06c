"""``DELETE /v1/devices/{device_id}/memory``: forget what a device's conversations left behind.

Removes the device's stored exchanges and summary (``session.memory: local``, gateway/llm/memory.py)
from the store (503 ``memory_store_error`` while it is unavailable)
and clears the history of its open session, if any. 204 when something was forgotten, 404 when
nothing was remembered for that device (or memory is off). Needs an API key when keys are set.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from gateway.api.auth import require_api_key
from gateway.api.errors import ApiError, ApiRoute
from gateway.services import Services
from gateway.store import StoreError
from gateway.xiaozhi.handshake import normalize_device_id

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_api_key)], tags=["devices"])

MAX_DEVICE_ID_CHARS = 128  # as at the device handshake


@router.delete("/v1/devices/{device_id}/memory", status_code=204, response_class=Response)
async def delete_device_memory(
    request: Request, device_id: Annotated[str, Path(min_length=1, max_length=MAX_DEVICE_ID_CHARS)]
) -> Response:
    services: Services = request.app.state.services
    device_id = normalize_device_id(device_id) or device_id  # as the device's session stores it
    if services.memory is None:
        raise ApiError(404, "conversation memory is off (session.memory: none)", code="memory_off")
    session = services.sessions.get(device_id)
    if session is not None:
        session.forget_history()
    try:
        forgotten = await services.memory.delete(device_id)
    except StoreError as exc:  # the store is down (StoreUnavailable) or refused: never a 500
        raise ApiError(503, f"the memory store failed: {exc}", code="memory_store_error") from exc
    if not forgotten:
        raise ApiError(404, f"nothing is remembered for device {device_id!r}", code="unknown_device",
                       param="device_id")  # fmt: skip
    return Response(status_code=204)
