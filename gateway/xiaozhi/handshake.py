"""What a device tells us in its WebSocket upgrade request (docs/xiaozhi-protocol.md section 2.1).

The firmware sends the headers ``Authorization: Bearer <token>``, ``Protocol-Version``,
``Device-Id`` and ``Client-Id``. Browser test clients, which cannot set headers, put
``device-id``, ``client-id`` and ``authorization`` in the URL query instead; the incumbent accepts
that, and so do we (a header always wins over the query). Names are matched case-insensitively.

``Device-Id`` and ``Client-Id`` are bounded (:data:`MAX_ID_CHARS`, printable characters only): real
ids are MAC addresses and UUIDs, and anything else would end up in every log line of the session.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import CloseCode, LocalProtocolError, RemoteProtocolError
from .framing import BINARY_VERSIONS

_BEARER = re.compile(r"bearer(?:\s+(.*))?", re.IGNORECASE | re.DOTALL)
_DIGITS = re.compile(r"[0-9]{1,3}")

MAX_ID_CHARS = 128
"""Longest Device-Id / Client-Id accepted (a MAC address has 17 characters, a UUID 36)."""


@dataclass(frozen=True, slots=True)
class HandshakeInfo:
    """Identity, credentials and binary framing version of a connecting device."""

    device_id: str | None
    client_id: str | None
    token: str | None
    protocol_version: int
    authenticated: bool = False
    """Set by the server once a token was verified (a static or a device token); never by the parser."""


def parse_handshake(headers: Mapping[str, str], query: Mapping[str, str]) -> HandshakeInfo:
    """Read device id, client id, token and binary protocol version from an upgrade request.

    ``Authorization: Bearer x`` gives token ``"x"``; a value without the ``Bearer`` scheme is taken
    verbatim (the firmware sends tokens that contain a space unchanged). Empty values count as
    absent. The protocol version comes from the ``Protocol-Version`` header, else the query's
    ``protocol-version`` or ``version``; absent means 1. Anything but 1, 2 or 3, and a Device-Id
    or Client-Id that fails :func:`check_identity`, raises :class:`RemoteProtocolError`.
    """
    header_values = _lowercase_keys(headers, "headers")
    query_values = _lowercase_keys(query, "query")

    def lookup(*names: str) -> str | None:
        for source in (header_values, query_values):
            for name in names:
                value = source.get(name, "").strip()
                if value:
                    return value
        return None

    return HandshakeInfo(
        device_id=normalize_device_id(check_identity("Device-Id", lookup("device-id"))),
        client_id=check_identity("Client-Id", lookup("client-id")),
        token=_token_from_authorization(lookup("authorization")),
        protocol_version=_protocol_version(
            header_values.get("protocol-version", "").strip()
            or query_values.get("protocol-version", "").strip()
            or query_values.get("version", "").strip()
        ),
    )


_MAC = re.compile(r"[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(?:\1[0-9A-Fa-f]{2}){4}")


def normalize_device_id(value: str | None) -> str | None:
    """A Device-Id as it is compared and stored: a MAC address in lower case with colons
    (``AA-BB-CC-DD-EE-FF`` -> ``aa:bb:cc:dd:ee:ff``, as the firmware sends it); anything else unchanged."""
    if value is None or not _MAC.fullmatch(value):
        return value
    return value.lower().replace("-", ":")


def check_identity(name: str, value: str | None) -> str | None:
    """``value`` unchanged if it is a sane device or client id, else :class:`RemoteProtocolError`.

    Sane: at most :data:`MAX_ID_CHARS` characters, none of them a control, format, surrogate,
    private-use or unassigned character (Unicode category ``C*``). The message never echoes the value.
    """
    if value is None:
        return None
    if len(value) > MAX_ID_CHARS:
        raise RemoteProtocolError(
            f"{name} is too long ({len(value)} characters, at most {MAX_ID_CHARS})",
            close_code_hint=CloseCode.PROTOCOL_ERROR,
        )
    if any(unicodedata.category(ch)[0] == "C" for ch in value):
        raise RemoteProtocolError(
            f"{name} contains control or unprintable characters", close_code_hint=CloseCode.PROTOCOL_ERROR
        )
    return value


def _lowercase_keys(mapping: Mapping[str, str], what: str) -> dict[str, str]:
    """Lowercase the names; the first of repeated names wins."""
    # websockets' Headers raise on items() when a name repeats; its raw_items() lists them all.
    raw_items = getattr(mapping, "raw_items", None)
    items = raw_items() if callable(raw_items) else mapping.items()
    result: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str):
            raise LocalProtocolError(f"{what} must map str to str, got {key!r}: {value!r}")
        result.setdefault(key.lower(), value)
    return result


def _token_from_authorization(value: str | None) -> str | None:
    if value is None:
        return None
    match = _BEARER.fullmatch(value)
    if match is None:
        return value
    return (match.group(1) or "").strip() or None


def _protocol_version(value: str) -> int:
    if not value:
        return 1
    if _DIGITS.fullmatch(value) is None or int(value) not in BINARY_VERSIONS:
        raise RemoteProtocolError(
            f"Protocol-Version must be 1, 2 or 3, got {value[:20]!r}",
            close_code_hint=CloseCode.PROTOCOL_ERROR,
        )
    return int(value)
