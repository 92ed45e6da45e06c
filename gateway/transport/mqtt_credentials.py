"""Per-device MQTT credentials: what OTA hands a device in its `mqtt` object, and the listener's check.

Derived like the device tokens (gateway/security/device_tokens.py): an HMAC-SHA256 with the server's
signing key (`server.auth.secret`, else `secret_file`, else a random key per process), so nothing
shared is handed out and nothing needs storing:

- username: ``xzm1.<expiry>.<Device-Id>.<Client-Id>`` (both base64url, the Client-Id empty when the OTA
  request had none); the expiry is Unix seconds, `transport.mqtt.credential_ttl_s` after the OTA check;
- client id: ``xiaozhi@@@<topic id>``; publish topic ``device-server/<topic id>``, subscribe topic
  ``devices/p2p/<topic id>``, where the topic id is the Device-Id with anything but letters, digits,
  ``.``, ``_`` and ``-`` replaced by ``_`` (``aa:bb:..`` -> ``aa_bb_..``);
- password: base64url of the HMAC over all of the above.

So a password opens the listener only for its own Device-Id, client id and topic, until it expires,
and only while the device is still allowed MQTT (checked at every CONNECT).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

from gateway.xiaozhi import RemoteProtocolError
from gateway.xiaozhi.handshake import check_identity

PREFIX = "xzm1"
_MAX_USERNAME = 600
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def topic_id(device_id: str) -> str:
    return _UNSAFE.sub("_", device_id)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8")).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")


@dataclass(frozen=True, slots=True)
class MqttIdentity:
    """Who a set of credentials belongs to."""

    device_id: str
    client_id: str  # the device's Client-Id (its UUID) from the OTA request, "" when it sent none
    expiry: int

    @property
    def mqtt_client_id(self) -> str:
        return f"xiaozhi@@@{topic_id(self.device_id)}"

    @property
    def publish_topic(self) -> str:
        return f"device-server/{topic_id(self.device_id)}"

    @property
    def subscribe_topic(self) -> str:
        return f"devices/p2p/{topic_id(self.device_id)}"

    @property
    def username(self) -> str:
        return f"{PREFIX}.{self.expiry}.{_b64(self.device_id)}.{_b64(self.client_id)}"


class CredentialError(Exception):
    """Why a CONNECT's credentials were refused (the message holds no secret)."""


class MqttCredentials:
    def __init__(self, secret: bytes, ttl_s: float) -> None:
        if len(secret) < 16:
            raise ValueError("the signing secret needs at least 16 bytes")
        self._secret = secret
        self.ttl_s = ttl_s

    def issue(self, device_id: str, client_id: str | None, *, now: float | None = None) -> tuple[MqttIdentity, str]:
        """The identity (client id, username, topics) and the password for a device."""
        identity = MqttIdentity(device_id, client_id or "", int((time.time() if now is None else now) + self.ttl_s))
        return identity, self._password(identity)

    def verify(
        self, mqtt_client_id: str, username: str | None, password: str | None, *, now: float | None = None
    ) -> MqttIdentity:
        """The identity these CONNECT fields prove; CredentialError otherwise (constant-time compare)."""
        if not username or not password or len(username) > _MAX_USERNAME:
            raise CredentialError("no or oversized username or password")
        parts = username.split(".")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[1].isascii() or not parts[1].isdigit():
            raise CredentialError("the username is not one OTA issued")
        if len(parts[1]) > 12:
            raise CredentialError("the username is not one OTA issued")
        try:
            device_id, client_id = _unb64(parts[2]), _unb64(parts[3])
            check_identity("Device-Id", device_id)
            check_identity("Client-Id", client_id)
        except (ValueError, binascii.Error, RemoteProtocolError):
            raise CredentialError("the username is not one OTA issued") from None
        if not device_id:
            raise CredentialError("the username is not one OTA issued")
        identity = MqttIdentity(device_id, client_id, int(parts[1]))
        expected = self._password(identity)
        if not hmac.compare_digest(password.encode("utf-8", "replace"), expected.encode("ascii")):
            raise CredentialError("bad password")
        if not hmac.compare_digest(mqtt_client_id.encode("utf-8", "replace"), identity.mqtt_client_id.encode()):
            raise CredentialError("the client id is not the one these credentials were issued for")
        if (time.time() if now is None else now) >= identity.expiry:
            raise CredentialError("the credentials have expired (the device gets new ones at its next OTA check)")
        return identity

    def _password(self, identity: MqttIdentity) -> str:
        message = "\n".join((PREFIX, "mqtt", str(identity.expiry), identity.device_id, identity.client_id,
                             identity.mqtt_client_id)).encode("utf-8")  # fmt: skip
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
