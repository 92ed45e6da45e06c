"""The device registry's management API (admin key): list, show, give an agent, kick, delete, activate.

- ``GET /v1/devices?limit=&offset=&state=``: devices, most recently seen first, with online state, agent,
  board, firmware, first and last seen, address and their last turns' first-audio latency.
- ``GET /v1/devices/{device_id}``; ``PATCH /v1/devices/{device_id}`` ``{"agent": "kid"}`` (null: the
  default agent) from the device's next turn; ``POST /v1/devices/{device_id}/kick`` closes its session
  (here at once; on another gateway at that gateway's next heartbeat); ``DELETE /v1/devices/{device_id}``
  forgets it, its code and its memory, and closes its session (it activates anew if it comes back).
- ``POST /v1/activations`` ``{"code": "123456", "agent": "kid"}``: binds the device that shows that code.

A store that is down or too slow: 503 ``store_unavailable`` (never a 500, never a hang).
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.agents.profile import DEFAULT_AGENT
from gateway.api.auth import require_admin
from gateway.api.errors import ApiError, ApiRoute
from gateway.devices.registry import CodeNotFound, DeviceNotFound, DeviceRecord
from gateway.services import Services
from gateway.store import StoreConflict, StoreError
from gateway.xiaozhi.handshake import MAX_ID_CHARS, normalize_device_id

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_admin)], tags=["devices"])
log = logging.getLogger(__name__)

DeviceId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
_CODE = re.compile(r"^[0-9]{6}$")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentChoice(_Body):
    agent: str | None = Field(None, max_length=48, description="an agent's name; null: the default agent")


class Activation(_Body):
    code: str = Field(min_length=1, max_length=16, description="the six digits the device shows and says")
    agent: str | None = Field(None, max_length=48, description="its agent; null: the default agent")


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    if services.devices is None or services.agents is None:
        raise ApiError(503, "the device registry is not running", code="store_unavailable")
    return services


def store_error(exc: StoreError) -> ApiError:
    if isinstance(exc, StoreConflict):
        return ApiError(409, f"the store refused the change: {exc}", code="conflict")
    return ApiError(
        503, f"the store is unavailable: {exc}", code="store_unavailable", headers={"Retry-After": "5"}
    )


def _agent_name(services: Services, name: str | None) -> str | None:
    """``None`` and ``default`` both mean the default agent."""
    assert services.agents is not None
    return None if services.agents.is_default(name) else name


def _public(services: Services, record: DeviceRecord) -> dict[str, Any]:
    data = record.public()
    data["agent"] = record.agent or DEFAULT_AGENT
    data["connected_here"] = record.device_id in services.sessions
    return data


@router.get("/v1/devices")
async def list_devices(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    state: Annotated[str | None, Query(pattern="^(seen|bound)$")] = None,
) -> dict[str, Any]:
    services = services_of(request)
    assert services.devices is not None
    try:
        records = await services.devices.list_devices(limit=limit, offset=offset, state=state)
        counts = await services.devices.count()
    except StoreError as exc:
        raise store_error(exc) from exc
    return {
        "data": [_public(services, r) for r in records],
        "counts": counts,
        "activation": services.config.ota.activation,
        "limit": limit,
        "offset": offset,
    }


@router.get("/v1/devices/{device_id}")
async def get_device(request: Request, device_id: DeviceId) -> dict[str, Any]:
    services = services_of(request)
    assert services.devices is not None
    try:
        record = await services.devices.get(normalize_device_id(device_id) or device_id)
    except DeviceNotFound as exc:
        raise ApiError(404, str(exc), code="unknown_device", param="device_id") from exc
    except StoreError as exc:
        raise store_error(exc) from exc
    return _public(services, record)


@router.patch("/v1/devices/{device_id}")
async def set_agent(request: Request, device_id: DeviceId, body: AgentChoice) -> dict[str, Any]:
    services = services_of(request)
    assert services.devices is not None
    device_id = normalize_device_id(device_id) or device_id
    try:
        record = await services.devices.set_agent(device_id, _agent_name(services, body.agent))
    except DeviceNotFound as exc:
        raise ApiError(404, str(exc), code="unknown_device", param="device_id") from exc
    except LookupError as exc:
        raise ApiError(404, str(exc), code="unknown_agent", param="agent") from exc
    except StoreError as exc:
        raise store_error(exc) from exc
    log.info("device %s: agent %s (from its next turn)", device_id, record.agent or "default")
    return _public(services, record)


@router.post("/v1/devices/{device_id}/kick")
async def kick_device(request: Request, device_id: DeviceId) -> dict[str, Any]:
    services = services_of(request)
    assert services.devices is not None
    device_id = normalize_device_id(device_id) or device_id
    here = services.kick(device_id)
    try:
        known = await services.devices.kick(device_id)
    except StoreError as exc:
        if not here:
            raise store_error(exc) from exc
        known = True
    if not (here or known):
        raise ApiError(404, f"no device {device_id!r}", code="unknown_device", param="device_id")
    return {"device_id": device_id, "closed_here": here, "requested": known}


@router.delete("/v1/devices/{device_id}", status_code=204, response_class=Response)
async def delete_device(request: Request, device_id: DeviceId) -> Response:
    services = services_of(request)
    assert services.devices is not None
    device_id = normalize_device_id(device_id) or device_id
    try:
        await services.devices.kick(device_id)  # another gateway's session of it closes too
        deleted = await services.devices.delete(device_id)
        if services.memory is not None:
            deleted = await services.memory.delete(device_id) or deleted
    except StoreError as exc:
        raise store_error(exc) from exc
    services.kick(device_id)
    if not deleted:
        raise ApiError(404, f"no device {device_id!r}", code="unknown_device", param="device_id")
    log.info("device %s deleted", device_id)
    return Response(status_code=204)


@router.post("/v1/activations")
async def activate_by_code(request: Request, body: Activation) -> dict[str, Any]:
    """Binds the device that shows ``code`` (single use), with ``agent``; it completes its activation at
    its next ``/activate`` poll and talks with that agent from then on."""
    services = services_of(request)
    assert services.devices is not None
    code = "".join(body.code.split())
    if not _CODE.match(code):
        raise ApiError(400, "an activation code is six digits", code="invalid_code", param="code")
    try:
        record = await services.devices.bind(code, _agent_name(services, body.agent))
    except CodeNotFound as exc:
        raise ApiError(404, str(exc), code="unknown_code", param="code") from exc
    except LookupError as exc:
        raise ApiError(404, str(exc), code="unknown_agent", param="agent") from exc
    except StoreError as exc:
        raise store_error(exc) from exc
    log.info("device %s bound by code to agent %s", record.device_id, record.agent or "default")
    return _public(services, record)
