"""The device registry's tables in the gateway's store (gateway/store, docs/devices-and-agents.md).

``devices_devices``: one row per device that called OTA or connected, bounded: a device that is not
``bound`` (never activated, never given an agent) is deleted ``devices.unbound_ttl_s`` after it was last
seen, and at most ``devices.max_unbound`` are kept. Every text field is cut to its column's length
before it is written (``clip``). ``devices_codes``: the live activation codes, one per device at most:
entered once by an operator (``bound_at``), deleted when the device has activated or the code expired. Times are unix seconds (one portable type on SQLite and PostgreSQL).
"""

from __future__ import annotations

from sqlalchemy import Column, Float, ForeignKey, Index, Integer, String, Table, Text

import gateway.agents.store  # noqa: F401 - agents_agents, which a device's agent references
from gateway.store import STORE_METADATA, Schema

__all__ = ["DEVICES_SCHEMA", "LIMITS", "clip", "devices_codes", "devices_devices"]

# the longest value kept per text column (what a device sends is cut to it, never refused for it)
LIMITS = {
    "device_id": 128, "client_id": 128, "board": 64, "firmware": 32, "user_agent": 160, "serial_number": 64,
    "address": 64, "gateway": 96, "agent": 48,
}  # fmt: skip
STATES = ("seen", "bound")

devices_devices = Table(
    "devices_devices",
    STORE_METADATA,
    Column("device_id", String(LIMITS["device_id"]), primary_key=True),
    Column("client_id", String(LIMITS["client_id"])),
    Column("state", String(8), nullable=False),  # seen | bound (an operator bound it or gave it an agent)
    Column("agent", String(LIMITS["agent"]), ForeignKey("agents_agents.name", ondelete="SET NULL")),
    Column("board", String(LIMITS["board"])),
    Column("firmware", String(LIMITS["firmware"])),
    Column("user_agent", String(LIMITS["user_agent"])),
    Column("serial_number", String(LIMITS["serial_number"])),
    Column("activation_version", Integer),
    Column("address", String(LIMITS["address"])),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    Column("bound_at", Float),
    Column("activated_at", Float),  # its /activate succeeded after it was bound (ota.activation: code)
    Column("connected_at", Float),  # of its live session (None: none)
    Column("online_until", Float),  # its gateway's last heartbeat + 2.5 heartbeats
    Column("gateway", String(LIMITS["gateway"])),  # the gateway that holds its session
    Column("kick_at", Float),  # asked to disconnect (the gateway that holds it closes it)
    Column("latency_ms", Text),  # JSON list: first-audio latency of its last turns
    Index("devices_by_state_seen", "state", "last_seen"),
)
devices_codes = Table(
    "devices_codes",
    STORE_METADATA,
    Column("code", String(6), primary_key=True),
    Column(
        "device_id",
        String(LIMITS["device_id"]),
        ForeignKey("devices_devices.device_id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    ),
    Column("challenge", String(64), nullable=False),
    Column("bound_at", Float),  # an operator entered it; the device completes with /activate
    Column("address", String(LIMITS["address"])),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
)

DEVICES_SCHEMA = Schema("devices", (devices_devices, devices_codes), version=1)


def clip(name: str, value: object) -> str | None:
    """A device-sent value as it is stored: printable text cut to its column, None when empty."""
    if value is None:
        return None
    text = "".join(ch for ch in str(value) if ch.isprintable()).strip()
    return text[: LIMITS[name]] or None
