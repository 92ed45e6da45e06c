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

Online state across gateways: the gateway that holds a device's session writes ``online_until`` (now
plus 2.5 heartbeats) at connect and at every heartbeat, and clears it at disconnect; a gateway that
vanished stops renewing it. A kick asked of another gateway (the CLI, another gateway's API) is
``kick_at``: the holding gateway closes the session at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, and_, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.agents.store import agents_agents
from gateway.config import DevicesConfig
from gateway.devices.tables import LIMITS, clip, devices_codes, devices_devices
from gateway.store import Store, StoreError

__all__ = [
    "CodeNotFound", "DeviceNotFound", "DeviceRecord", "DeviceRegistry", "DeviceReport", "DeviceState",
    "TooManyDevices",
]  # fmt: skip

log = logging.getLogger(__name__)

ONLINE_HEARTBEATS = 2.5  # a device is online this many heartbeats after its gateway last renewed it
EXPIRE_EVERY = 10  # heartbeats between two expiry runs
LIST_MAX = 500


class DeviceNotFound(LookupError):
    """No device with that Device-Id."""


class CodeNotFound(LookupError):
    """No live activation code like that (never issued, expired, or already entered)."""


class TooManyDevices(RuntimeError):
    """The registry is full of live activation codes (``devices.max_pending_codes``)."""


@dataclass(frozen=True)
class DeviceReport:
    """What a device tells about itself at OTA (headers and body), as it is stored (cut to length)."""

    device_id: str
    client_id: str | None = None
    board: str | None = None
    firmware: str | None = None
    user_agent: str | None = None
    serial_number: str | None = None
    activation_version: int | None = None
    address: str | None = None

    @classmethod
    def from_ota(
        cls, device_id: str, client_id: str | None, headers: Any, body: dict[str, Any], address: str | None
    ) -> DeviceReport:
        """From an OTA request: the body's ``board.type`` and ``application.version`` (lenient: any type),
        else the User-Agent's ``<board>/<version>``; ``Serial-Number`` and ``Activation-Version`` headers."""
        agent = headers.get("user-agent") or ""
        ua_board, _, ua_version = agent.partition("/")
        board = body.get("board")
        application = body.get("application")
        board_type = board.get("type") if isinstance(board, dict) else None
        version = application.get("version") if isinstance(application, dict) else None
        activation = (headers.get("activation-version") or "").strip()
        return cls(
            device_id=device_id,
            client_id=clip("client_id", client_id),
            board=clip("board", board_type if isinstance(board_type, str) and board_type else ua_board),
            firmware=clip("firmware", version if isinstance(version, str) and version else ua_version),
            user_agent=clip("user_agent", agent),
            serial_number=clip("serial_number", headers.get("serial-number")),
            activation_version=int(activation) if activation in ("1", "2") else None,
            address=clip("address", address),
        )


@dataclass(frozen=True)
class DeviceRecord:
    """One device as the management API shows it."""

    device_id: str
    client_id: str | None
    state: str
    agent: str | None
    board: str | None
    firmware: str | None
    user_agent: str | None
    serial_number: str | None
    address: str | None
    first_seen: float
    last_seen: float
    bound_at: float | None
    activated_at: float | None
    online: bool
    gateway: str | None
    latency_ms: list[float]
    pending_code: bool  # a live activation code waits to be entered

    def public(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class DeviceState:
    """What a turn needs to know of its device: its agent (stored profile JSON), activation."""

    bound: bool
    activated: bool
    agent: str | None
    agent_profile: str | None  # the agent row's profile JSON (None: no agent or it is gone)
    agent_version: int
    code: str | None  # its live activation code
    code_bound: bool
    challenge: str | None
    code_expires: float | None = None


@dataclass
class _Live:
    """A device with a session on this gateway."""

    connected_at: float
    latencies: deque[float] = field(default_factory=deque)


def gateway_name() -> str:
    """This gateway, as the registry names who holds a device's session: host and process id."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}"


class DeviceRegistry:
    def __init__(self, store: Store, cfg: DevicesConfig, *, name: str | None = None) -> None:
        self.store = store
        self.cfg = cfg
        self.name = (name or gateway_name())[: LIMITS["gateway"]]
        self._live: dict[str, _Live] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_kick: Callable[[str], object] | None = None  # close a device's session (set by Services)

    def spawn(self, write: Coroutine[Any, Any, None], what: str) -> None:
        """Runs a write in the background (a session never waits for the registry): bounded by the store,
        a failure logged."""

        async def run() -> None:
            try:
                await write
            except StoreError as exc:
                log.info("device registry: %s not recorded: %s", what, exc)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Waits for the background writes (tests, shutdown)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    # ---- OTA and connections ------------------------------------------------------

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
                await self._make_room(conn, now)
                await conn.execute(
                    insert(devices_devices).values(
                        device_id=report.device_id, state="seen", first_seen=now, last_seen=now, **values
                    )
                )
            return await self._record(conn, report.device_id, now)

    async def connected(self, device_id: str, client_id: str | None, *, may_add: bool = True) -> None:
        """A session of this gateway began (its row made if the device skipped OTA)."""
        now = time.time()
        self._live[device_id] = _Live(connected_at=now, latencies=deque(maxlen=self.cfg.latency_turns))
        online = {"connected_at": now, "online_until": self._online_until(now), "gateway": self.name,
                  "last_seen": now, "kick_at": None}  # fmt: skip
        async with self.store.write() as conn:
            changed = await conn.execute(
                update(devices_devices).where(devices_devices.c.device_id == device_id).values(**online)
            )
            if changed.rowcount == 0 and may_add:
                await self._make_room(conn, now)
                await conn.execute(
                    insert(devices_devices).values(
                        device_id=device_id,
                        client_id=clip("client_id", client_id),
                        state="seen",
                        first_seen=now,
                        **online,
                    )  # fmt: skip
                )

    def turn_latency(self, device_id: str, seconds: float) -> None:
        """A turn's first audio came this long after the user's words (written at the next heartbeat)."""
        live = self._live.get(device_id)
        if live is not None:
            live.latencies.append(round(seconds * 1000, 1))

    async def disconnected(self, device_id: str) -> None:
        """This gateway's session of the device ended (a newer one elsewhere keeps its own state)."""
        live = self._live.pop(device_id, None)
        if live is None:
            return
        now = time.time()
        async with self.store.write() as conn:
            await conn.execute(
                update(devices_devices)
                .where(
                    devices_devices.c.device_id == device_id,
                    devices_devices.c.gateway == self.name,
                    devices_devices.c.connected_at == live.connected_at,
                )  # fmt: skip
                .values(connected_at=None, online_until=None, last_seen=now, **_latency(live))
            )

    # ---- what a turn reads ----------------------------------------------------------

    async def state(self, device_id: str, *, timeout_s: float | None = None) -> DeviceState | None:
        """The device's agent (with its stored profile) and activation, in one query within ``timeout_s``
        (default ``devices.lookup_timeout_s``, a turn's bound); None when the device is not registered."""
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
        async with self.store.read(timeout_s=timeout_s or self.cfg.lookup_timeout_s) as conn:
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

    # ---- the operator's side --------------------------------------------------------

    async def list_devices(
        self, *, limit: int = 100, offset: int = 0, state: str | None = None
    ) -> list[DeviceRecord]:
        """Devices, the most recently seen first (``state``: seen | bound; at most LIST_MAX a page)."""
        now = time.time()
        query = self._records_query().order_by(
            devices_devices.c.last_seen.desc(), devices_devices.c.device_id
        )
        if state is not None:
            query = query.where(devices_devices.c.state == state)
        async with self.store.read() as conn:
            rows = (await conn.execute(query.limit(min(limit, LIST_MAX)).offset(max(0, offset)))).all()
        return [_record(row, now) for row in rows]

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
            return await self._record(conn, device_id, time.time())

    async def set_agent(self, device_id: str, agent: str | None) -> DeviceRecord:
        """Gives the device an agent (None: the default) from its next turn; the device is then bound
        (kept, never expired). ``LookupError`` for an unknown device or agent."""
        now = time.time()
        async with self.store.write() as conn:
            if agent is not None:
                await _require_agent(conn, agent)
            changed = await conn.execute(
                update(devices_devices)
                .where(devices_devices.c.device_id == device_id)
                .values(agent=agent, state="bound", bound_at=func.coalesce(devices_devices.c.bound_at, now))
            )
            if changed.rowcount == 0:
                raise DeviceNotFound(f"no device {device_id!r}")
            return await self._record(conn, device_id, now)

    async def bind(self, code: str, agent: str | None) -> DeviceRecord:
        """An operator entered ``code``: its device is bound, with ``agent`` (None: the default).

        Single use: a code entered once is gone for binding. The device completes its activation at its
        next ``/activate`` (gateway/devices/activation.py). ``CodeNotFound``: no live code like that."""
        now = time.time()
        async with self.store.write() as conn:
            if agent is not None:
                await _require_agent(conn, agent)
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
            return await self._record(conn, device_id, now)

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

    # ---- heartbeat and expiry -------------------------------------------------------------

    def start(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat(), name="device-registry-heartbeat")

    async def aclose(self) -> None:
        """Stops the heartbeat; background writes land first (each bounded by the store)."""
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.store.timeout_s + 1)

    async def _beat(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)  # a timer, not a poll: it renews this gateway's devices
            beats += 1
            try:
                kicked = await self.heartbeat()
                if beats % EXPIRE_EVERY == 0:
                    await self.expire()
            except StoreError as exc:
                log.warning("device registry heartbeat: %s", exc)
                continue
            for device_id in kicked:
                log.info("device %s: kicked through the registry", device_id)
                if self.on_kick is not None:
                    self.on_kick(device_id)

    async def heartbeat(self) -> list[str]:
        """Renews this gateway's live devices (online, last seen, latencies); the ones asked to leave."""
        if not self._live:
            return []
        now = time.time()
        live = dict(self._live)
        async with self.store.write() as conn:
            for device_id, entry in live.items():
                await conn.execute(
                    update(devices_devices)
                    .where(devices_devices.c.device_id == device_id, devices_devices.c.gateway == self.name)
                    .values(online_until=self._online_until(now), last_seen=now, **_latency(entry))
                )
            rows = await conn.execute(
                select(devices_devices.c.device_id, devices_devices.c.kick_at).where(
                    devices_devices.c.device_id.in_(list(live)), devices_devices.c.kick_at.is_not(None)
                )
            )
            return [device_id for device_id, kick_at in rows if kick_at >= live[device_id].connected_at]

    async def expire(self) -> int:
        """Deletes devices that are not bound and were last seen ``unbound_ttl_s`` ago; expired codes."""
        now = time.time()
        async with self.store.write() as conn:
            await conn.execute(delete(devices_codes).where(devices_codes.c.expires_at <= now))
            result = await conn.execute(
                delete(devices_devices).where(
                    devices_devices.c.state == "seen",
                    devices_devices.c.last_seen < now - self.cfg.unbound_ttl_s,
                    or_(devices_devices.c.online_until.is_(None), devices_devices.c.online_until < now),
                )
            )
        if result.rowcount:
            log.info("device registry: %d devices that never activated expired", result.rowcount)
        return int(result.rowcount)

    # ---- internals ------------------------------------------------------------------

    def _online_until(self, now: float) -> float:
        return now + ONLINE_HEARTBEATS * self.cfg.heartbeat_s

    async def _make_room(self, conn: AsyncConnection, now: float) -> None:
        """Before a new device's row: at most ``max_unbound`` devices that are not bound (expired ones
        first, then the least recently seen)."""
        unbound = devices_devices.c.state == "seen"
        count = (
            await conn.execute(select(func.count()).select_from(devices_devices).where(unbound))
        ).scalar_one()
        if count < self.cfg.max_unbound:
            return
        await conn.execute(
            delete(devices_devices).where(unbound, devices_devices.c.last_seen < now - self.cfg.unbound_ttl_s)
        )
        count = (
            await conn.execute(select(func.count()).select_from(devices_devices).where(unbound))
        ).scalar_one()
        excess = count - self.cfg.max_unbound + 1
        if excess > 0:
            oldest = (
                select(devices_devices.c.device_id)
                .where(unbound)
                .order_by(devices_devices.c.last_seen, devices_devices.c.device_id)
                .limit(excess)
            )
            ids = [row[0] for row in (await conn.execute(oldest)).all()]
            await conn.execute(delete(devices_devices).where(devices_devices.c.device_id.in_(ids)))
            log.warning(
                "device registry full (devices.max_unbound): %d least recently seen dropped", len(ids)
            )

    def _records_query(self) -> Any:
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

    async def _record(self, conn: AsyncConnection, device_id: str, now: float) -> DeviceRecord:
        row = (
            await conn.execute(self._records_query().where(devices_devices.c.device_id == device_id))
        ).first()
        if row is None:
            raise DeviceNotFound(f"no device {device_id!r}")
        return _record(row, now)


async def _require_agent(conn: AsyncConnection, agent: str) -> None:
    found = (await conn.execute(select(agents_agents.c.name).where(agents_agents.c.name == agent))).first()
    if found is None:
        raise LookupError(f"no agent {agent!r}")


def _latency(live: _Live) -> dict[str, Any]:
    return {"latency_ms": json.dumps(list(live.latencies))} if live.latencies else {}


def _latencies(text: str | None) -> list[float]:
    try:
        values = json.loads(text) if text else []
    except ValueError:
        return []
    return [float(v) for v in values if isinstance(v, int | float)] if isinstance(values, list) else []


def _record(row: Row[Any], now: float) -> DeviceRecord:
    m = row._mapping
    until = m["online_until"]
    return DeviceRecord(
        device_id=m["device_id"],
        client_id=m["client_id"],
        state=m["state"],
        agent=m["agent"],
        board=m["board"],
        firmware=m["firmware"],
        user_agent=m["user_agent"],
        serial_number=m["serial_number"],
        address=m["address"],
        first_seen=float(m["first_seen"]),
        last_seen=float(m["last_seen"]),
        bound_at=m["bound_at"],
        activated_at=m["activated_at"],
        online=until is not None and until > now,
        gateway=m["gateway"] if until is not None and until > now else None,
        latency_ms=_latencies(m["latency_ms"]),
        pending_code=bool(m["pending_code"]),
    )
