"""Activation by code, as the firmware does it (ota.cc, docs/devices-and-agents.md): ``ota.activation: code``.

1. OTA: an unknown device's reply carries ``activation {code, message, challenge, timeout_ms}``; the
   firmware shows the message, speaks the six digits, and polls ``POST <ota>/activate``. Its next OTA
   checks get the same code and challenge until the code expires (``devices.code_ttl_s``), then a new one.
2. An operator enters the code (console, ``python -m gateway devices bind CODE``, the API): the device
   is bound, with an agent. A code is entered once (single use); a wrong one is refused.
3. ``/activate``: 202 while the code waits, 200 once it was entered and the device proved itself;
   the device then checks OTA again and gets its device token and WebSocket address.

The proof (firmware activation v2): a device with a serial number in eFuse posts
``{"algorithm": "hmac-sha256", "serial_number", "challenge", "hmac"}``, the hex HMAC-SHA256 of the challenge
under its eFuse key; v1 devices post ``{}``. The challenge must be the one we issued. Where
``devices.activation_keys_file`` knows the serial number, the HMAC must match; a device without a known
key activates by its code alone (``devices.activation_hmac: optional``) or not at all (``required``).
A refused call is a 403, counted per address (``devices.activate_failures_per_address`` an hour, then
429). New devices per address are rate-limited (``devices.new_per_address``), live codes capped
(``devices.max_pending_codes``): a client cannot make codes without limit.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, DevicesConfig
from gateway.devices.rate_limit import RateLimit
from gateway.devices.registry import DeviceRecord, DeviceRegistry, DeviceReport, TooManyDevices
from gateway.store import StoreConflict

__all__ = ["Activation", "ActivationKeys", "ActivateAnswer", "OtaActivation", "spoken_code"]

log = logging.getLogger(__name__)

CODE_DIGITS = 6
CODE_ATTEMPTS = 8  # draws of a code that another device holds, before giving up
MAX_HMAC_CHARS = 128


class ActivationKeys:
    """Serial number -> the device's HMAC key, from ``devices.activation_keys_file``."""

    def __init__(self, keys: dict[str, bytes] | None = None) -> None:
        self._keys = dict(keys or {})

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, path: str) -> ActivationKeys:
        """Lines ``SERIAL KEY`` (``#`` comments); KEY ``hex:...`` is bytes, anything else its UTF-8."""
        if not path:
            return cls()
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"devices.activation_keys_file: cannot read {path}: {exc}") from None
        keys: dict[str, bytes] = {}
        for number, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConfigError(f"devices.activation_keys_file line {number}: expected 'SERIAL KEY'")
            serial, key = parts
            try:
                keys[serial] = bytes.fromhex(key[4:]) if key.startswith("hex:") else key.encode("utf-8")
            except ValueError:
                raise ConfigError(f"devices.activation_keys_file line {number}: bad hex key") from None
        return cls(keys)

    def key_for(self, serial: str | None) -> bytes | None:
        return self._keys.get(serial) if serial else None


@dataclass(frozen=True)
class OtaActivation:
    """What OTA answers a device in code mode."""

    activated: bool  # give it its token and no activation object
    activation: dict[str, Any] | None = None  # the activation object to send
    retry_after_s: float | None = None  # too many new devices from its address (HTTP 429)
    record: DeviceRecord | None = None


@dataclass(frozen=True)
class ActivateAnswer:
    status: int  # 200 done, 202 waiting, 403 refused, 404 nothing pending, 429 too many refusals
    body: dict[str, Any]


def spoken_code(code: str) -> str:
    """The code as a sentence reads it digit by digit (text normalisation would read 123456 as a number)."""
    return " ".join(code)


class Activation:
    def __init__(
        self, cfg: DevicesConfig, registry: DeviceRegistry, keys: ActivationKeys | None = None
    ) -> None:
        self.cfg = cfg
        self.registry = registry
        self.keys = keys or ActivationKeys()
        self.new_devices = RateLimit(cfg.new_per_address)
        self.failures = RateLimit(cfg.activate_failures_per_address)

    def message(self, code: str) -> str:
        return self.cfg.activation_message.format(code=code)

    async def record(self, report: DeviceReport) -> DeviceRecord | None:
        """Records the OTA check; a new device only within its address's rate (None when it is new and
        over it)."""
        address = report.address or "?"
        may_add = self.new_devices.allowed(address)
        record = await self.registry.seen(report, may_add=may_add)
        if record is not None and record.first_seen == record.last_seen:  # made just now
            self.new_devices.hit(address)
        return record

    async def at_ota(self, report: DeviceReport) -> OtaActivation:
        """Code mode: activated devices get their token; others their (existing or new) code."""
        record = await self.record(report)
        if record is None:
            wait = self.new_devices.retry_after(report.address or "?")
            log.info(
                "OTA from device %s refused: too many new devices from %s", report.device_id, report.address
            )
            return OtaActivation(activated=False, retry_after_s=max(1.0, wait))
        if record.activated_at is not None:
            return OtaActivation(activated=True, record=record)
        state = await self.registry.state(report.device_id, timeout_s=self.registry.store.timeout_s)
        if state is not None and state.code is not None and state.challenge is not None:
            code, challenge, expires = state.code, state.challenge, state.code_expires or time.time()
        else:
            code, challenge, expires = await self._new_code(report)
            log.info("device %s: activation code issued", report.device_id)
        activation = {
            "code": code,
            "message": self.message(code),
            "challenge": challenge,
            "timeout_ms": max(0, int((expires - time.time()) * 1000)),
        }
        return OtaActivation(activated=False, activation=activation, record=record)

    async def _new_code(self, report: DeviceReport) -> tuple[str, str, float]:
        challenge = secrets.token_hex(16)
        for _ in range(CODE_ATTEMPTS):
            code = f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"
            try:
                expires = await self.registry.add_code(report.device_id, code, challenge, report.address)
            except StoreConflict:
                continue  # held by another device: draw again
            return code, challenge, expires
        raise TooManyDevices("no free activation code found; try again later")

    async def activate(
        self, device_id: str | None, headers: Any, body: dict[str, Any], address: str | None
    ) -> ActivateAnswer:
        """``POST <ota>/activate``: see the module's docstring."""
        address = address or "?"
        if not self.failures.allowed(address):
            wait = self.failures.retry_after(address)
            return ActivateAnswer(429, {"success": False, "message": "too many refused activations",
                                        "retry_after_s": round(wait)})  # fmt: skip
        if not device_id:
            return ActivateAnswer(400, {"success": False, "message": "Device-Id header missing"})
        state = await self.registry.state(device_id, timeout_s=self.registry.store.timeout_s)
        if state is None:
            return ActivateAnswer(404, {"success": False, "message": "unknown device: check OTA first"})
        if state.activated:
            return ActivateAnswer(200, {"success": True, "message": "activated"})
        if state.code is None or state.challenge is None:
            return ActivateAnswer(
                404, {"success": False, "message": "no activation pending: check OTA again"}
            )
        refused = self._refusal(state.challenge, headers, body)
        if refused is not None:
            self.failures.hit(address)
            log.info("device %s: activation refused: %s", device_id, refused)
            return ActivateAnswer(403, {"success": False, "message": refused})
        if not state.code_bound:
            return ActivateAnswer(202, {"success": False, "message": "waiting for the code to be entered"})
        if not await self.registry.complete_activation(device_id):
            return ActivateAnswer(202, {"success": False, "message": "waiting for the code to be entered"})
        log.info("device %s activated", device_id)
        return ActivateAnswer(200, {"success": True, "message": "activated"})

    def _refusal(self, challenge: str, headers: Any, body: dict[str, Any]) -> str | None:
        """Why the device's proof is refused (None: accepted)."""
        given_challenge = body.get("challenge")
        if given_challenge is not None and given_challenge != challenge:
            return "the challenge is not the one issued: check OTA again"
        serial = body.get("serial_number") or headers.get("serial-number") or None
        serial = serial if isinstance(serial, str) and len(serial) <= 64 else None
        key = self.keys.key_for(serial)
        if key is None:
            if self.cfg.activation_hmac == "required":
                return "no activation key is known for this device's serial number"
            return None
        given = body.get("hmac")
        if given_challenge is None or not isinstance(given, str) or len(given) > MAX_HMAC_CHARS:
            return "the HMAC of the challenge is missing"
        expected = hmac.new(key, challenge.encode("utf-8"), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(given.lower().encode("ascii", "replace"), expected.encode("ascii")):
            return "the HMAC does not match this serial number's key"
        return None
