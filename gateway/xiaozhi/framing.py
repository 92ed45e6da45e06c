"""Binary audio framing, versions 1, 2 and 3 (docs/xiaozhi-protocol.md section 5).

* v1: the WebSocket binary message is the raw Opus packet.
* v2: 16-byte header ``u16 version=2, u16 type=0, u32 reserved=0, u32 timestamp_ms, u32 payload_size``.
* v3: 4-byte header ``u8 type=0, u8 reserved=0, u16 payload_size``.

All header fields are big-endian. Like the firmware, the receiver trusts ``payload_size`` rather
than the message length and ignores ``version``/``type``/``reserved``; bytes after the payload are
ignored. A message shorter than its header, or than header + ``payload_size``, is rejected.
"""

from __future__ import annotations

import struct

from .errors import CloseCode, LocalProtocolError, RemoteProtocolError

BINARY_VERSIONS = (1, 2, 3)

_V2_HEADER = struct.Struct(">HHIII")  # version, type, reserved, timestamp_ms, payload_size
_V3_HEADER = struct.Struct(">BBH")  # type, reserved, payload_size
_AUDIO_TYPE = 0

V2_HEADER_SIZE = _V2_HEADER.size  # 16
V3_HEADER_SIZE = _V3_HEADER.size  # 4

_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1


def header_size(version: int) -> int:
    """Number of header bytes in front of the Opus packet for a framing version."""
    _check_version(version)
    return {1: 0, 2: V2_HEADER_SIZE, 3: V3_HEADER_SIZE}[version]


def pack_audio(version: int, opus: bytes, timestamp_ms: int = 0) -> bytes:
    """Frame one Opus packet for sending. ``timestamp_ms`` is carried by v2 only (v1/v3 drop it)."""
    _check_version(version)
    if not isinstance(opus, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"opus must be bytes, got {type(opus).__name__}")
    if (
        isinstance(timestamp_ms, bool)
        or not isinstance(timestamp_ms, int)
        or not 0 <= timestamp_ms <= _U32_MAX
    ):
        raise LocalProtocolError(f"timestamp_ms must be an integer in 0..{_U32_MAX}, got {timestamp_ms!r}")
    opus = bytes(opus)
    if version == 1:
        return opus
    if version == 2:
        if len(opus) > _U32_MAX:
            raise LocalProtocolError(f"Opus packet of {len(opus)} bytes does not fit a v2 frame")
        return _V2_HEADER.pack(2, _AUDIO_TYPE, 0, timestamp_ms, len(opus)) + opus
    if len(opus) > _U16_MAX:
        raise LocalProtocolError(f"Opus packet of {len(opus)} bytes does not fit a v3 frame (max {_U16_MAX})")
    return _V3_HEADER.pack(_AUDIO_TYPE, 0, len(opus)) + opus


def unpack_audio(version: int, data: bytes) -> tuple[bytes, int]:
    """Strip the framing header from a received binary message; return (opus, timestamp_ms).

    Raises :class:`RemoteProtocolError` for a message shorter than its header or its payload_size.
    """
    _check_version(version)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if version == 1:
        return data, 0
    header = _V2_HEADER if version == 2 else _V3_HEADER
    if len(data) < header.size:
        raise RemoteProtocolError(
            f"v{version} audio frame of {len(data)} bytes is shorter than its {header.size}-byte header",
            close_code_hint=CloseCode.INVALID_DATA,
        )
    if version == 2:
        _version, _type, _reserved, timestamp_ms, payload_size = header.unpack_from(data)
    else:
        _type, _reserved, payload_size = header.unpack_from(data)
        timestamp_ms = 0
    end = header.size + payload_size
    if len(data) < end:
        raise RemoteProtocolError(
            f"v{version} audio frame announces {payload_size} payload bytes but carries "
            f"{len(data) - header.size}",
            close_code_hint=CloseCode.INVALID_DATA,
        )
    return data[header.size : end], timestamp_ms


def _check_version(version: int) -> None:
    if type(version) is not int or version not in BINARY_VERSIONS:
        raise LocalProtocolError(f"binary protocol version must be 1, 2 or 3, got {version!r}")
