"""The `devices` section: the device registry's bounds and activation by code (`ota.activation: code`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gateway.config.base import Section


class DevicesConfig(Section):
    """The registry of devices (gateway/devices, docs/devices-and-agents.md)."""

    # A device that never activated (and was never given an agent) is forgotten this long after it was
    # last seen; at most max_unbound such devices are kept (the oldest go first).
    unbound_ttl_s: float = Field(7 * 86400, ge=60, le=366 * 86400)
    max_unbound: int = Field(10000, ge=10, le=10_000_000)
    # Each gateway refreshes its connected devices' rows this often (online state, last seen, the
    # last turns' latency); a device shows offline 2.5 heartbeats after its gateway vanished.
    heartbeat_s: float = Field(30, ge=1, le=600)
    # The first-audio latencies kept per device (its last turns).
    latency_turns: int = Field(10, ge=1, le=100)
    # A turn reads its device's agent from the store within this bound; past it (or with the store
    # down) the turn runs with the default agent and no memory.
    lookup_timeout_s: float = Field(1.0, gt=0, le=30)

    # --- activation by code (ota.activation: code) ---
    # How long a code stays valid; the device gets the same code at every OTA check until then.
    code_ttl_s: float = Field(600, ge=30, le=86400)
    # Shown on the device's screen and spoken to an unbound device ({code}: the six digits).
    activation_message: str = Field("请在控制台输入验证码 {code} 绑定设备", min_length=1, max_length=200)
    # What a device that has not activated hears when it talks (it has no code: it gets one at its
    # next OTA check, i.e. its next boot).
    not_activated_message: str = Field("设备还没有激活，请重启设备获取验证码", min_length=1, max_length=200)
    # Devices first seen (and activation codes issued) per client address per hour (a household or
    # classroom behind one NAT shares it), and refused /activate calls (a wrong HMAC or challenge) per
    # address per hour. Past the first, an unknown device is served but not recorded (activation off)
    # or told to retry later (HTTP 429; activation code).
    new_per_address: int = Field(30, ge=1, le=100_000)
    activate_failures_per_address: int = Field(60, ge=1, le=100_000)
    # Live codes at most (all addresses together); past it new devices are asked to retry later.
    max_pending_codes: int = Field(10000, ge=10, le=1_000_000)
    # Activation v2 (devices with a serial number send an HMAC-SHA256 of the challenge under the key in
    # their eFuse): optional: checked where activation_keys_file knows the serial number, anything
    # else activates by its code alone; required: only devices whose HMAC checks out activate.
    activation_hmac: Literal["optional", "required"] = "optional"
    # Lines of "SERIAL_NUMBER KEY" (KEY: hex:<64 hex digits> for a 32-byte eFuse key, else the text
    # itself); read at start-up. A secret: keep it readable by the gateway only.
    activation_keys_file: str = ""

    @field_validator("activation_message")
    @classmethod
    def _one_code(cls, v: str) -> str:
        try:
            v.format(code="000000")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"may hold {{code}} and no other placeholder ({exc})") from None
        return v
