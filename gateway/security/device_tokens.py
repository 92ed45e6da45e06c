"""Who may open the device socket: static operator tokens and signed per-device tokens.

The model (docs/device-auth.md):

- ``server.auth.tokens`` are operator secrets. They open the socket for any Device-Id and are
  never sent to anyone by the server.
- OTA hands a *device token* only to a device that is admitted: its Device-Id is in
  ``server.auth.allowed_devices``, or ``server.auth.ota_open`` is on, or it activated by code
  (``ota.activation: code``, gateway/devices/activation.py). A device token is an
  HMAC-SHA256 signature over the Device-Id (and the Client-Id when the OTA request had one) and an
  expiry, so it opens the socket only for that Device-Id, only until it expires, and only while the
  device is still admitted.
- A Device-Id in ``allowed_devices`` may still connect with no token (the incumbent server's
  white-list), but that is identification, not authentication: such a connection never replaces a
  session that presented a valid token.

The signing key is ``server.auth.secret``, else the content of ``server.auth.secret_file`` (created
with a random key on first start), else a random key per process: then device tokens stop
working when the server restarts (a device fetches a new one at its next OTA check, i.e. its next
boot), and the start-up log says so.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from gateway.config import AuthConfig, ConfigError
from gateway.xiaozhi import HandshakeInfo

log = logging.getLogger(__name__)

TOKEN_PREFIX = "xzd1"
MIN_SECRET_CHARS = 16


class Admission(enum.Enum):
    """The device socket's verdict on a connection."""

    REFUSED = "refused"
    IDENTIFIED = "identified"  # auth off, or an allow-listed Device-Id without a token
    AUTHENTICATED = "authenticated"  # a static token, or a valid device token for this Device-Id


class DeviceTokenSigner:
    """Issues and checks ``xzd1.<expiry>.<scope>.<signature>`` tokens bound to a Device-Id.

    ``scope`` is ``d`` (bound to the Device-Id) or ``dc`` (Device-Id and Client-Id); the expiry is
    in Unix seconds. Nothing secret is inside the token, and nothing in it can be changed without
    the key.
    """

    def __init__(self, secret: bytes, ttl_s: float) -> None:
        if len(secret) < MIN_SECRET_CHARS:
            raise ValueError(f"the signing secret needs at least {MIN_SECRET_CHARS} bytes")
        self._secret = secret
        self.ttl_s = ttl_s

    def issue(self, device_id: str, client_id: str | None = None, *, now: float | None = None) -> str:
        expiry = int((time.time() if now is None else now) + self.ttl_s)
        scope = "dc" if client_id else "d"
        return f"{TOKEN_PREFIX}.{expiry}.{scope}.{self._sign(expiry, scope, device_id, client_id or '')}"

    def verify(
        self, token: str, device_id: str | None, client_id: str | None = None, *, now: float | None = None
    ) -> bool:
        if not device_id:
            return False
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != TOKEN_PREFIX or parts[2] not in ("d", "dc"):
            return False
        _, expiry_text, scope, signature = parts
        if not expiry_text.isascii() or not expiry_text.isdigit() or len(expiry_text) > 12:
            return False
        expiry = int(expiry_text)
        bound_client = (client_id or "") if scope == "dc" else ""
        expected = self._sign(expiry, scope, device_id, bound_client)
        if not hmac.compare_digest(signature.encode("utf-8", "replace"), expected.encode("ascii")):
            return False
        return (time.time() if now is None else now) < expiry

    def _sign(self, expiry: int, scope: str, device_id: str, client_id: str) -> str:
        message = "\n".join((TOKEN_PREFIX, str(expiry), scope, device_id, client_id)).encode("utf-8")
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _matches_any(token: str, candidates: list[str]) -> bool:
    """Constant-time membership: every candidate is compared, as bytes (non-ASCII safe)."""
    given = token.encode("utf-8")
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(given, candidate.encode("utf-8"))
    return found


def load_secret(auth: AuthConfig) -> tuple[bytes, str]:
    """The signing key and where it came from (``config``, ``file <path>`` or ``random``)."""
    if auth.secret:
        return auth.secret.encode("utf-8"), "config"
    if auth.secret_file:
        return _secret_from_file(Path(auth.secret_file)), f"file {auth.secret_file}"
    return secrets.token_bytes(32), "random"


def _secret_from_file(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"server.auth.secret_file: cannot create {path}: {exc}") from exc
    else:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(32) + "\n")
        log.info("server.auth.secret_file: created %s with a new random signing key", path)
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"server.auth.secret_file: cannot read {path}: {exc}") from exc
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"server.auth.secret_file: {path} holds fewer than {MIN_SECRET_CHARS} characters")
    return secret.encode("utf-8")


class DeviceAuth:
    """The admission rules of ``server.auth`` for OTA and the device socket (one per app)."""

    def __init__(self, auth: AuthConfig, signer: DeviceTokenSigner | None) -> None:
        self.auth = auth
        self.signer = signer

    @classmethod
    def from_config(cls, auth: AuthConfig) -> DeviceAuth:
        if not auth.enabled:
            return cls(auth, None)
        secret, source = load_secret(auth)
        if source == "random":
            log.warning(
                "server.auth: no secret or secret_file set; device tokens are signed with a random key "
                "and stop working when the server restarts (devices get new ones at their next OTA check)"
            )
        return cls(auth, DeviceTokenSigner(secret, auth.device_token_ttl_s))

    def admitted(self, device_id: str | None, *, activated: bool = False) -> bool:
        """May this Device-Id get (and use) a device token? ``activated``: it activated by code
        (``ota.activation: code``, the device registry says so)."""
        return bool(device_id) and (activated or self.auth.ota_open or device_id in self.auth.allowed_devices)

    def token_for(self, device_id: str | None, client_id: str | None, *, activated: bool = False) -> str:
        """The token OTA sends: "" with auth off or for a device that is not admitted."""
        if self.signer is None or not device_id or not self.admitted(device_id, activated=activated):
            return ""
        return self.signer.issue(device_id, client_id)

    def check(self, info: HandshakeInfo, *, activated: bool = False) -> Admission:
        if self.signer is None:
            return Admission.IDENTIFIED
        token = info.token
        if token:
            if _matches_any(token, self.auth.tokens):
                return Admission.AUTHENTICATED
            admitted = self.admitted(info.device_id, activated=activated)
            if admitted and self.signer.verify(token, info.device_id, info.client_id):
                return Admission.AUTHENTICATED
        if info.device_id and info.device_id in self.auth.allowed_devices:
            return Admission.IDENTIFIED
        return Admission.REFUSED
