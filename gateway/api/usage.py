"""``GET /v1/usage``: what was served, per key (and device) and UTC day (gateway/service/usage.py).

A key sees its own usage; an admin key (config keys, ``keys add --admin``, everyone while no key is
needed) sees every key's and device's, or one of them with ``key=NAME`` / ``device=ID``. ``days``
(1..366, default 7) counts back from today. Rows are per subject and day; ``totals`` sums each subject
over the period. Latency is the time from a speech request's arrival to its first audio byte (device
turns: the user's query to the first audio frame), as percentiles of a histogram (p50, p95, p99, ms).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gateway.api.auth import current_account, require_api_key
from gateway.api.errors import ApiError, ApiRoute, api_error
from gateway.service.usage import UsageRow, device_subject, key_subject
from gateway.services import Services
from gateway.store import StoreError

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_api_key)], tags=["usage"])


@router.get("/v1/usage")
async def usage(
    request: Request,
    days: Annotated[int, Query(ge=1, le=366)] = 7,
    key: Annotated[str | None, Query(max_length=64, description="a key's name (admin keys only)")] = None,
    device: Annotated[str | None, Query(max_length=192, description="a Device-Id (admin keys only)")] = None,
) -> JSONResponse:
    services: Services = request.app.state.services
    account = current_account(request)
    subjects: list[str] | None
    if not account.admin:
        if (key is not None and key != account.name) or device is not None:
            raise ApiError(403, f"key {account.name!r} may only see its own usage", code="permission_denied")
        subjects = [key_subject(account.name)]
    elif key is not None or device is not None:
        subjects = ([key_subject(key)] if key else []) + ([device_subject(device)] if device else [])
    else:
        subjects = None
    try:
        rows = await services.usage.report(subjects, days=days)
    except StoreError as exc:
        raise api_error(exc) from exc
    return JSONResponse({"object": "list", "days": days, "data": [row.as_dict() for row in rows],
                         "totals": totals(rows)})  # fmt: skip


def totals(rows: list[UsageRow]) -> list[dict[str, Any]]:
    """Each subject's rows summed over the period."""
    merged: dict[str, UsageRow] = {}
    for row in rows:
        seen = merged.get(row.subject)
        if seen is None:
            merged[row.subject] = UsageRow(row.subject, "", row.requests, row.errors, row.characters, row.audio_s,
                                           list(row.first_byte))  # fmt: skip
        else:
            merged[row.subject] = UsageRow(
                row.subject, "", seen.requests + row.requests, seen.errors + row.errors,
                seen.characters + row.characters, seen.audio_s + row.audio_s,
                [a + b for a, b in zip(seen.first_byte, row.first_byte, strict=True)],
            )  # fmt: skip
    out = []
    for subject in sorted(merged):
        summary = merged[subject].as_dict()
        summary.pop("day")
        summary["object"] = "usage.total"
        out.append(summary)
    return out
