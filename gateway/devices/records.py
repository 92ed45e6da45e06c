"""What the device registry (gateway/devices/registry.py) takes in and gives out: a device's own report at
OTA (headers and body, cut to the columns of gateway/devices/tables.py), a device as the management API
shows it, what a turn needs of its device, and the registry's errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from gateway.devices.tables import clip

__all__ = [
    "CodeNotFound", "DeviceNotFound", "DeviceRecord", "DeviceReport", "DeviceState", "TooManyDevices",
    "record_from_row",
]  # fmt: skip


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


def _latencies(text: str | None) -> list[float]:
    try:
        values = json.loads(text) if text else []
    except ValueError:
        return []
    return [float(v) for v in values if isinstance(v, int | float)] if isinstance(values, list) else []


def record_from_row(row: Row[Any], now: float) -> DeviceRecord:
    """A row of ``records_query`` (gateway/devices/queries.py) as of ``now``: online while its gateway renews it."""
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
