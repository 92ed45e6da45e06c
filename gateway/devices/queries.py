"""The device registry's reads and bounds in the store (gateway/devices/tables.py), each inside a caller's
transaction: a device's record with its pending code, its state for a turn (agent and code in one query),
an agent that must exist, and room for a new device that is not bound."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import and_, delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.agents.store import agents_agents
from gateway.config import DevicesConfig
from gateway.devices.records import DeviceNotFound, DeviceRecord, DeviceState, record_from_row
from gateway.devices.tables import devices_codes, devices_devices

log = logging.getLogger("gateway.devices.registry")


def records_query() -> Any:
    """Devices with ``pending_code``: a live code waits to be entered."""
    has_code = (
        select(devices_codes.c.code)
        .where(
            and_(
                devices_codes.c.device_id == devices_devices.c.device_id,
                devices_codes.c.expires_at > time.time(),
                devices_codes.c.bound_at.is_(None),
            )
        )  # fmt: skip
        .exists()
    )
    return select(devices_devices, has_code.label("pending_code"))


async def read_record(conn: AsyncConnection, device_id: str, now: float) -> DeviceRecord:
    row = (await conn.execute(records_query().where(devices_devices.c.device_id == device_id))).first()
    if row is None:
        raise DeviceNotFound(f"no device {device_id!r}")
    return record_from_row(row, now)


async def read_state(conn: AsyncConnection, device_id: str) -> DeviceState | None:
    """The device's agent (with its stored profile) and activation, in one query; None when the device is
    not registered."""
    d, a, c = devices_devices.c, agents_agents.c, devices_codes.c
    query = (
        select(
            d.state,
            d.activated_at,
            d.agent,
            a.profile,
            a.version,
            c.code,
            c.bound_at,
            c.challenge,
            c.expires_at,
        )  # fmt: skip
        .select_from(
            devices_devices.outerjoin(agents_agents, a.name == d.agent).outerjoin(
                devices_codes, c.device_id == d.device_id
            )
        )
        .where(d.device_id == device_id)
    )
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    live_code = row.code is not None and row.expires_at > time.time()
    return DeviceState(
        bound=row.state == "bound",
        activated=row.activated_at is not None,
        agent=row.agent,
        agent_profile=row.profile,
        agent_version=int(row.version or 0),
        code=row.code if live_code else None,
        code_bound=live_code and row.bound_at is not None,
        challenge=row.challenge if live_code else None,
        code_expires=row.expires_at if live_code else None,
    )


async def require_agent(conn: AsyncConnection, agent: str) -> None:
    found = (await conn.execute(select(agents_agents.c.name).where(agents_agents.c.name == agent))).first()
    if found is None:
        raise LookupError(f"no agent {agent!r}")


async def make_room(conn: AsyncConnection, cfg: DevicesConfig, now: float) -> None:
    """Before a new device's row: at most ``max_unbound`` devices that are not bound (expired ones
    first, then the least recently seen)."""
    unbound = devices_devices.c.state == "seen"
    count = (
        await conn.execute(select(func.count()).select_from(devices_devices).where(unbound))
    ).scalar_one()
    if count < cfg.max_unbound:
        return
    await conn.execute(
        delete(devices_devices).where(unbound, devices_devices.c.last_seen < now - cfg.unbound_ttl_s)
    )
    count = (
        await conn.execute(select(func.count()).select_from(devices_devices).where(unbound))
    ).scalar_one()
    excess = count - cfg.max_unbound + 1
    if excess > 0:
        oldest = (
            select(devices_devices.c.device_id)
            .where(unbound)
            .order_by(devices_devices.c.last_seen, devices_devices.c.device_id)
            .limit(excess)
        )
        ids = [row[0] for row in (await conn.execute(oldest)).all()]
        await conn.execute(delete(devices_devices).where(devices_devices.c.device_id.in_(ids)))
        log.warning("device registry full (devices.max_unbound): %d least recently seen dropped", len(ids))
