"""The device registry: every device that called OTA or connected, in the store (gateway/devices/tables.py).

One ``DeviceRegistry`` per gateway. What it records: Device-Id, Client-Id, board and firmware (OTA body
and User-Agent), serial number, first and last seen, address, its agent, whether an operator bound it
and whether it activated, which gateway holds its session and until when it counts as online, and the
first-audio latency of its last turns. Every method is one bounded store transaction and raises
``StoreError`` (``StoreUnavailable`` when the store is down); callers decide what that means (OTA and
turns degrade, the management API answers 503).

Bounds: a client cannot grow the tables without limit. A device that is not bound is deleted
``devices.unbound_ttl_s`` after it was last seen (``expire``, run by the heartbeat), at most
``devices.max_unbound`` of them are kept (the least recently seen goes when a new one comes), new ones
per client address are rate-limited by the caller (gateway/devices/activation.py), every field is cut
to its column, and an agent name must exist (a foreign key).

Its parts: what it takes in and gives out (gateway/devices/records.py: ``DeviceReport`` from OTA,
``DeviceRecord``, ``DeviceState``, the errors), its reads and bounds in the store
(gateway/devices/queries.py), and its live side (gateway/devices/heartbeat.py: this gateway's sessions,
online state by heartbeat, kicks across gateways, expiry).
"""

from __future__ import annotations

import time

from sqlalchemy import delete, func, insert, select, update

from gateway.devices.heartbeat import RegistryHeartbeat
from gateway.devices.queries import make_room, read_record, read_state, records_query, require_agent
from gateway.devices.records import (
    CodeNotFound,
    DeviceNotFound,
    DeviceRecord,
    DeviceReport,
    DeviceState,
    TooManyDevices,
    record_from_row,
)
from gateway.devices.tables import clip, devices_codes, devices_devices

__all__ = [
    "CodeNotFound", "DeviceNotFound", "DeviceRecord", "DeviceRegistry", "DeviceReport", "DeviceState",
    "TooManyDevices",
]  # fmt: skip

LIST_MAX = 500


class DeviceRegistry(RegistryHeartbeat):
    """The registry's calls, each one bounded store transaction; the live side is ``RegistryHeartbeat``'s."""

    # ---- OTA ------------------------------------------------------------------------

    async def seen(self, report: DeviceReport, *, may_add: bool = True) -> DeviceRecord | None:
        """Records an OTA check: the device's row, made if new (``may_add``: within its address's rate);
        None when it is new and may not be added."""
        now = time.time()
        values = {
            name: getattr(report, name)
            for name in (
                "client_id",
                "board",
                "firmware",
                "user_agent",
                "serial_number",
                "activation_version",
                "address",
            )  # fmt: skip
            if getattr(report, name) is not None
        }
        async with self.store.write() as conn:
            changed = await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == report.device_id)
                .values(last_seen=now, **values)
            )
            if changed.rowcount == 0:
                if not may_add:
                    return None
                await make_room(conn, self.cfg, now)
                await conn.execute(
                    insert(devices_devices).values(
                        device_id=report.device_id, state="seen", first_seen=now, last_seen=now, **values
                    )
                )
            return await read_record(conn, report.device_id, now)

    # ---- what a turn reads ----------------------------------------------------------

    async def state(self, device_id: str, *, timeout_s: float | None = None) -> DeviceState | None:
        """The device's agent (with its stored profile) and activation, in one query within ``timeout_s``
        (default ``devices.lookup_timeout_s``, a turn's bound); None when the device is not registered."""
        async with self.store.read(timeout_s=timeout_s or self.cfg.lookup_timeout_s) as conn:
            return await read_state(conn, device_id)

    # ---- the operator's side --------------------------------------------------------

    async def list_devices(
        self, *, limit: int = 100, offset: int = 0, state: str | None = None
    ) -> list[DeviceRecord]:
        """Devices, the most recently seen first (``state``: seen | bound; at most LIST_MAX a page)."""
        now = time.time()
        query = records_query().order_by(devices_devices.c.last_seen.desc(), devices_devices.c.device_id)
        if state is not None:
            query = query.where(devices_devices.c.state == state)
        async with self.store.read() as conn:
            rows = (await conn.execute(query.limit(min(limit, LIST_MAX)).offset(max(0, offset)))).all()
        return [record_from_row(row, now) for row in rows]

    async def count(self) -> dict[str, int]:
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(devices_devices.c.state, func.count()).group_by(devices_devices.c.state)
                )
            ).all()
        return {str(state): int(n) for state, n in rows}

    async def get(self, device_id: str) -> DeviceRecord:
        async with self.store.read() as conn:
            return await read_record(conn, device_id, time.time())

    async def set_agent(self, device_id: str, agent: str | None) -> DeviceRecord:
        """Gives the device an agent (None: the default) from its next turn; the device is then bound
        (kept, never expired). ``LookupError`` for an unknown device or agent."""
        now = time.time()
        async with self.store.write() as conn:
            if agent is not None:
                await require_agent(conn, agent)
            changed = await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == device_id)
                .values(agent=agent, state="bound", bound_at=func.coalesce(devices_devices.c.bound_at, now))
            )
            if changed.rowcount == 0:
                raise DeviceNotFound(f"no device {device_id!r}")
            return await read_record(conn, device_id, now)

    async def bind(self, code: str, agent: str | None) -> DeviceRecord:
        """An operator entered ``code``: its device is bound, with ``agent`` (None: the default).

        Single use: a code entered once is gone for binding. The device completes its activation at its
        next ``/activate`` (gateway/devices/activation.py). ``CodeNotFound``: no live code like that."""
        now = time.time()
        async with self.store.write() as conn:
            if agent is not None:
                await require_agent(conn, agent)
            row = (
                await conn.execute(
                    update(devices_codes)
                    .where(
                        devices_codes.c.code == code,
                        devices_codes.c.expires_at > now,
                        devices_codes.c.bound_at.is_(None),
                    )  # fmt: skip
                    .values(bound_at=now)
                    .returning(devices_codes.c.device_id)
                )
            ).first()
            if row is None:
                raise CodeNotFound(
                    f"no activation code {code} is waiting (mistyped, expired or already used)"
                )
            device_id = row[0]
            await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == device_id)
                .values(state="bound", agent=agent, bound_at=now)
            )
            return await read_record(conn, device_id, now)

    async def delete(self, device_id: str) -> bool:
        """Forgets the device (its code goes with it); it activates anew if it comes back."""
        async with self.store.write() as conn:
            result = await conn.execute(
                delete(devices_devices).where(devices_devices.c.device_id == device_id)
            )
        return result.rowcount > 0

    async def kick(self, device_id: str) -> bool:
        """Asks the gateway that holds the device's session to close it (at its next heartbeat)."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == device_id)
                .values(kick_at=time.time())
            )
        return result.rowcount > 0

    # ---- activation codes (gateway/devices/activation.py) ---------------------------

    async def add_code(self, device_id: str, code: str, challenge: str, address: str | None) -> float:
        """Stores a new code for the device (its previous one, if any, replaced); its expiry.
        ``StoreConflict``: the code is taken by another device (the caller draws another)."""
        now = time.time()
        expires = now + self.cfg.code_ttl_s
        async with self.store.write() as conn:
            await conn.execute(delete(devices_codes).where(devices_codes.c.expires_at <= now))
            await conn.execute(delete(devices_codes).where(devices_codes.c.device_id == device_id))
            live = (await conn.execute(select(func.count()).select_from(devices_codes))).scalar_one()
            if live >= self.cfg.max_pending_codes:
                raise TooManyDevices(f"{live} devices are waiting for activation; try again later")
            bound = (
                await conn.execute(
                    select(devices_devices.c.state).where(devices_devices.c.device_id == device_id)
                )
            ).scalar_one_or_none() == "bound"
            await conn.execute(
                insert(devices_codes).values(
                    code=code,
                    device_id=device_id,
                    challenge=challenge,
                    address=clip("address", address),
                    created_at=now,
                    expires_at=expires,
                    bound_at=now if bound else None,
                )  # fmt: skip
            )
        return expires

    async def complete_activation(self, device_id: str) -> bool:
        """The device proved itself after it was bound: activated, its code gone. False if not bound."""
        now = time.time()
        async with self.store.write() as conn:
            changed = await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == device_id, devices_devices.c.state == "bound")
                .values(activated_at=func.coalesce(devices_devices.c.activated_at, now))
            )
            if changed.rowcount == 0:
                return False
            await conn.execute(delete(devices_codes).where(devices_codes.c.device_id == device_id))
        return True
