"""The device registry's live side (gateway/devices/registry.py): this gateway's sessions, their online
state, the heartbeat that renews it, kicks and expiry, and the background writes a session never waits for.

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

from sqlalchemy import delete, insert, or_, select, update

from gateway.config import DevicesConfig
from gateway.devices.queries import make_room
from gateway.devices.tables import LIMITS, clip, devices_codes, devices_devices
from gateway.store import Store, StoreError

log = logging.getLogger("gateway.devices.registry")  # the registry's one log

ONLINE_HEARTBEATS = 2.5  # a device is online this many heartbeats after its gateway last renewed it
EXPIRE_EVERY = 10  # heartbeats between two expiry runs


@dataclass
class _Live:
    """A device with a session on this gateway."""

    connected_at: float
    latencies: deque[float] = field(default_factory=deque)


def gateway_name() -> str:
    """This gateway, as the registry names who holds a device's session: host and process id."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}"


class RegistryHeartbeat:
    """The part of ``DeviceRegistry`` that knows this gateway's live sessions."""

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

    # ---- this gateway's sessions ----------------------------------------------------

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
                await make_room(conn, self.cfg, now)
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


def _latency(live: _Live) -> dict[str, Any]:
    return {"latency_ms": json.dumps(list(live.latencies))} if live.latencies else {}
